"""OpenAI request validation and mapping onto pipeline REQUEST bodies (no server)."""
import base64
import io

import numpy as np
import pytest
import soundfile as sf

from omni_frontend import pipelines
from omni_frontend.chat_protocol import ChatRequest, to_pipeline
from omni_frontend.errors import APIError, from_triton_message
from omni_frontend.routes.transcriptions import subtitles

pytestmark = pytest.mark.unit


def _wav_b64(seconds: float, rate: int = 8000) -> str:
    buf = io.BytesIO()
    sf.write(buf, np.full(int(seconds * rate), 0.1, np.float32), rate, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_chat_request_maps_to_pipeline_body_with_audio_slices():
    req = ChatRequest(model="voice", messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "input_audio", "input_audio": {"data": _wav_b64(0.5), "format": "wav"}},
                                     {"type": "input_audio", "input_audio": {"data": _wav_b64(0.25), "format": "wav"}}]}],
        max_completion_tokens=7, stop="END", audio={"voice": "v1", "format": "pcm16"}, seed=3, top_k=5)
    body, pcm = to_pipeline(req)
    assert body["messages"][0] == {"role": "system", "content": [{"type": "text", "text": "be brief"}]}
    parts = body["messages"][1]["content"]
    assert parts[1] == {"type": "input_audio", "offset": 0, "samples": 8000, "sample_rate": 16000}
    assert parts[2] == {"type": "input_audio", "offset": 8000, "samples": 4000, "sample_rate": 16000}
    assert pcm.dtype == np.float32 and pcm.shape == (12000,)
    assert (body["max_tokens"], body["stop"], body["voice"], body["seed"], body["top_k"]) == (7, ["END"], "v1", 3, 5)
    assert body["modalities"] == ["text", "audio"]


@pytest.mark.parametrize("messages, param", [
    ([{"role": "system", "content": "only system"}], "messages"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}]}],
     "messages[0].content.input_audio"),
    ([{"role": "user", "content": [{"type": "input_audio",
                                    "input_audio": {"data": base64.b64encode(b"no audio here" * 9).decode()}}]}],
     "messages[0].content.input_audio"),
])
def test_bad_chat_content_is_a_400(messages, param):
    with pytest.raises(APIError) as info:
        to_pipeline(ChatRequest(model="voice", messages=messages))
    assert info.value.status == 400 and info.value.param == param


def test_streaming_a_container_format_is_rejected():
    req = ChatRequest(model="voice", messages=[{"role": "user", "content": "x"}], stream=True,
                      audio={"voice": "v", "format": "mp3"})
    with pytest.raises(APIError, match="cannot be streamed"):
        to_pipeline(req)


def test_triton_error_messages_map_to_http_statuses():
    rejected = from_triton_message('{"error": {"message": "bad voice", "type": "invalid_request_error", '
                                   '"param": "voice", "code": "invalid_voice", "status": 400}}')
    assert (rejected.status, rejected.param, rejected.code) == (400, "voice", "invalid_voice")
    dead = from_triton_message("Stub process 'voice_tts_0_0' is not healthy.")
    assert dead.status == 503 and dead.code == "model_unavailable"
    crashed = from_triton_message("voice_llm: RuntimeError: boom")
    assert crashed.status == 500 and "boom" in crashed.message
    assert set(crashed.body()["error"]) == {"message", "type", "param", "code"}


def test_subtitles():
    segments = [{"start": 0.0, "end": 1.5, "text": " Hello."}, {"start": 61.25, "end": 3723.004, "text": "World"}]
    assert subtitles(segments, "srt") == ("1\n00:00:00,000 --> 00:00:01,500\nHello.\n\n"
                                          "2\n00:01:01,250 --> 01:02:03,004\nWorld\n")
    assert subtitles(segments, "vtt").startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello.\n")


def test_pipeline_registry():
    chosen = pipelines.resolve(["tts", "asr"])
    assert pipelines.triton_models(chosen) == ["voice_tts", "tts", "voice_asr", "voice_asr_stream"]
    extra = pipelines.parse_extra("m=chat:a,b")
    assert (extra.entry, extra.models, extra.kind) == ("b", ("a", "b"), "chat")
    with pytest.raises(ValueError, match="unknown pipeline"):
        pipelines.resolve(["nope"])
    with pytest.raises(ValueError, match="bad pipeline spec"):
        pipelines.parse_extra("m=video:a")
