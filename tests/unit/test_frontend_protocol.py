"""OpenAI request validation and mapping onto pipeline REQUEST bodies (no server)."""
import base64
import io

import numpy as np
import pydantic
import pytest
import soundfile as sf

from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.serving import turn as omni_turn
from omni_backends.serving import events
from omni_backends.voice import protocol as voice_protocol
from omni_frontend import audio as audio_codec
from omni_frontend import pipelines
from omni_frontend.chat_protocol import ChatRequest, to_pipeline
from omni_frontend.config import RequestLimits
from omni_frontend.errors import APIError, from_triton_message
from omni_frontend.routes.transcriptions import subtitles
from omni_frontend.validation import invalid_text

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
    body, tensors = to_pipeline(req)
    pcm = tensors["INPUT_AUDIO"]
    assert tensors.keys() == {"INPUT_AUDIO"}
    assert body["messages"][0] == {"role": "system", "content": [{"type": "text", "text": "be brief"}]}
    parts = body["messages"][1]["content"]
    assert parts[1] == {"type": "input_audio", "offset": 0, "samples": 8000, "sample_rate": 16000}
    assert parts[2] == {"type": "input_audio", "offset": 8000, "samples": 4000, "sample_rate": 16000}
    assert pcm.dtype == np.float32 and pcm.shape == (12000,)
    assert (body["max_tokens"], body["stop"], body["voice"], body["seed"], body["top_k"]) == (7, ["END"], "v1", 3, 5)
    assert body["modalities"] == ["text", "audio"]


@pytest.mark.parametrize("messages, param", [
    ([{"role": "system", "content": "only system"}], "messages"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"},
                                   {"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}]}],
     "messages[0].content[1].input_audio"),
    ([{"role": "user", "content": [{"type": "input_audio",
                                    "input_audio": {"data": base64.b64encode(b"no audio here" * 9).decode()}}]}],
     "messages[0].content[0].input_audio"),
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
        pipelines.parse_extra("m=hologram:a")


USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("field, value", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    ("tool_choice", "required"), ("tool_choice", "auto"), ("functions", [{"name": "f"}]), ("function_call", "auto"),
    ("parallel_tool_calls", True), ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
    ("logprobs", True), ("top_logprobs", 2), ("logit_bias", {"50256": -100}), ("prediction", {"type": "content"}),
    ("reasoning_effort", "low"),
    ("verbosity", "high"), ("web_search_options", {}), ("moderation", {"mode": "block"}),
])
def test_contract_changing_fields_are_rejected_naming_the_field(field, value):
    with pytest.raises(APIError) as info:
        to_pipeline(ChatRequest(model="voice", messages=USER, **{field: value}))
    assert (info.value.status, info.value.param, info.value.code) == (400, field, "unsupported_parameter")


def test_one_walker_refuses_unsupported_fields_with_each_protocol_error():
    """validation.refuse_unsupported serves the HTTP routes (APIError 400 `unsupported_parameter`) and the realtime
    session (ProtocolError `unsupported_feature`, dotted paths): an absent or inert value passes, `false` is not
    `0`, and the first refused field of the table is named."""
    from omni_frontend.chat_protocol import UNSUPPORTED_FIELDS, unsupported_parameter
    from omni_frontend.realtime import config as realtime
    from omni_frontend.realtime.protocol import ProtocolError
    from omni_frontend.validation import refuse_unsupported

    refuse_unsupported({"logprobs": False, "tools": [], "user": "u"}, UNSUPPORTED_FIELDS, unsupported_parameter)
    with pytest.raises(APIError) as info:
        refuse_unsupported({"logprobs": 0, "tools": [{}]}, UNSUPPORTED_FIELDS, unsupported_parameter)
    assert (info.value.status, info.value.param, info.value.code, info.value.message) == (
        400, "tools", "unsupported_parameter", "tools is not supported: the served models do not call tools")
    with pytest.raises(APIError, match="^logprobs is not supported: "):
        refuse_unsupported({"logprobs": 0}, UNSUPPORTED_FIELDS, unsupported_parameter)
    session_error = realtime.unsupported_feature("session.")
    refuse_unsupported({"audio": {"input": None}, "truncation": "auto"}, realtime.SESSION_UNSUPPORTED, session_error)
    with pytest.raises(ProtocolError) as info:
        refuse_unsupported({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
                           realtime.SESSION_UNSUPPORTED, session_error)
    assert (info.value.code, info.value.param, info.value.message) == (
        "unsupported_feature", "session.audio.input.noise_reduction",
        "session.audio.input.noise_reduction is not supported by this server: the input audio is not denoised")


def test_a_pipeline_control_field_is_not_passed_on_as_an_extension_field():
    """Extension fields go to the pipeline REQUEST, whose "action" key asks a pipeline for its voices instead
    of an answer: a chat or speech request carrying it was answered 200 with no content."""
    with pytest.raises(APIError) as info:
        to_pipeline(ChatRequest(model="voice", messages=USER, action="voices"))
    assert (info.value.status, info.value.param, info.value.code) == (400, "action", "unsupported_parameter")


def test_inert_and_bookkeeping_fields_are_accepted_and_not_passed_on():
    body, _ = to_pipeline(ChatRequest(
        model="voice", messages=USER, tools=[], tool_choice="none", response_format={"type": "text"}, logprobs=False,
        frequency_penalty=0, presence_penalty=0.0, user="u1", metadata={"k": "v"}, store=True, service_tier="auto",
        talker_do_sample=False))
    assert body["talker_do_sample"] is False   # extension fields still reach the pipeline
    assert not {"tools", "user", "metadata", "store", "logprobs", "response_format"} & set(body)


@pytest.mark.parametrize("message, param", [
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}, "messages[0].tool_calls"),
    ({"role": "assistant", "audio": {"id": "audio_1"}}, "messages[0].audio"),
])
def test_message_fields_that_need_stored_state_are_rejected(message, param):
    with pytest.raises(APIError) as info:
        to_pipeline(ChatRequest(model="voice", messages=[message, *USER]))
    assert info.value.param == param


@pytest.mark.parametrize("audio, param", [({"voice": "", "format": "wav"}, "audio.voice"),
                                          ({"voice": {"id": " "}, "format": "wav"}, "audio.voice"),
                                          ({"voice": {"id": 5}, "format": "wav"}, "audio.voice"),
                                          ({"voice": {"name": "alloy"}, "format": "wav"}, "audio.voice"),
                                          ({"voice": "alloy", "format": "ogg"}, "audio.format"),
                                          ({"voice": "alloy", "format": "wav", "speed": 2}, "audio.speed"),
                                          ({"format": "wav"}, "audio.voice")])
def test_chat_audio_object_is_validated_strictly(audio, param):
    with pytest.raises(pydantic.ValidationError) as info:
        ChatRequest(model="voice", messages=USER, audio=audio)
    assert ".".join(str(p) for p in info.value.errors()[0]["loc"]) == param


@pytest.mark.parametrize("fields, param", [({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
                                           ({"max_tokens": "10"}, "max_tokens"), ({"stream": 1}, "stream")])
def test_chat_json_types_are_strict_in_nested_objects_too(fields, param):
    with pytest.raises(pydantic.ValidationError) as info:
        ChatRequest(model="voice", messages=USER, **fields)
    assert ".".join(str(p) for p in info.value.errors()[0]["loc"]) == param


def test_json_null_means_the_default_for_every_optional_field_of_every_body_model():
    """OpenAI types its optional request fields as nullable and reads null as "not given" (chat `n`, `stream`; images
    `n`, `stream`, `response_format`, `output_format`, `partial_images`; speech `response_format`, `speed`, ...):
    clients that serialise unset fields as null got 400s. Every JSON body model now takes null as the default;
    required fields stay required."""
    from omni_frontend.chat_protocol import AudioParams, StreamOptions
    from omni_frontend.routes.images import ImageOptions
    from omni_frontend.routes.speech import SpeechRequest
    from omni_frontend.routes.videos import VideoCreateRequest

    required = {ChatRequest: {"model": "voice", "messages": USER}, AudioParams: {"voice": "alloy"}, StreamOptions: {},
                SpeechRequest: {"input": "hi", "voice": "alloy"}, ImageOptions: {"prompt": "a cube"},
                VideoCreateRequest: {"prompt": "a cube"}}
    defaulted = set()
    for model, body in required.items():
        for name, field in model.model_fields.items():
            if field.is_required():
                with pytest.raises(pydantic.ValidationError) as info:
                    model.model_validate({**body, name: None})
                assert info.value.errors()[0]["loc"] == (name,), (model, name)
            elif field.default is not None:
                assert getattr(model.model_validate({**body, name: None}), name) == field.default, (model, name)
                defaulted.add(f"{model.__name__}.{name}")
    assert {"ChatRequest.n", "ChatRequest.stream", "ImageOptions.n", "ImageOptions.stream", "ImageOptions.response_format",
            "ImageOptions.output_format", "ImageOptions.partial_images", "SpeechRequest.speed"} <= defaulted, defaulted


def test_request_limits():
    limits = RequestLimits(max_text_chars=10, max_messages=2, max_audio_seconds=0.6)
    for request, param, code in [
        (ChatRequest(model="v", messages=USER * 3), "messages", "too_many_messages"),
        (ChatRequest(model="v", messages=[{"role": "user", "content": "x" * 11}]), "messages[0].content", "text_too_long"),
        (ChatRequest(model="v", messages=[{"role": "system", "content": "x" * 6}, {"role": "user", "content": "y" * 5}]),
         "messages[1].content", "text_too_long"),
        (ChatRequest(model="v", messages=USER, stop=["s" * 11]), "stop", "text_too_long"),
        (ChatRequest(model="v", messages=[{"role": "user", "content": [{"type": "text", "text": "x" * 6},
                                                                       {"type": "text", "text": "y" * 5}]}]),
         "messages[0].content[1]", "text_too_long"),
    ]:
        with pytest.raises(APIError) as info:
            to_pipeline(request, limits)
        assert (info.value.status, info.value.param, info.value.code) == (400, param, code)
    body, tensors = to_pipeline(ChatRequest(model="v", messages=[{"role": "user", "content": [
        {"type": "text", "text": "x" * 10},
        {"type": "input_audio", "input_audio": {"data": _wav_b64(0.5), "format": "wav"}}]}]), limits)
    assert tensors["INPUT_AUDIO"].size == 8000 and body["messages"][0]["content"][0]["text"] == "x" * 10


def test_audio_limit_error_states_the_limit_and_names_the_part_that_passes_it():
    """Two parts together over --max-audio-seconds: the message states the limit itself (not the budget left
    for the second part) and the seconds heard; param is the offending part's path, with its index."""
    limits = RequestLimits(max_audio_seconds=0.6)
    parts = [{"type": "text", "text": "listen"},
             {"type": "input_audio", "input_audio": {"data": _wav_b64(0.5), "format": "wav"}},
             {"type": "input_audio", "input_audio": {"data": _wav_b64(0.25), "format": "wav"}}]
    with pytest.raises(APIError) as info:
        to_pipeline(ChatRequest(model="v", messages=[{"role": "user", "content": "hi"},
                                                     {"role": "assistant", "content": "?"},
                                                     {"role": "user", "content": parts}]), limits)
    assert (info.value.status, info.value.param, info.value.code) == (
        400, "messages[2].content[2].input_audio", "audio_too_long")
    assert info.value.message == ("the request's input audio is longer than 0.6 s in all (limit --max-audio-seconds): "
                                  "0.5 s in earlier parts, then more than 0.1 s in messages[2].content[2].input_audio")
    with pytest.raises(APIError) as info:   # one part alone over the limit: no earlier parts to count
        to_pipeline(ChatRequest(model="v", messages=[{"role": "user", "content": [parts[1]]}]),
                    RequestLimits(max_audio_seconds=0.3))
    assert info.value.message == ("the request's input audio is longer than 0.3 s in all (limit --max-audio-seconds): "
                                  "more than 0.3 s in messages[0].content[0].input_audio")


def test_decode_stops_at_the_audio_limit():
    raw = base64.b64decode(_wav_b64(2.0))
    assert audio_codec.decode(raw, 16000, max_seconds=2.0).size == 32000
    with pytest.raises(audio_codec.AudioTooLong):
        audio_codec.decode(raw, 16000, max_seconds=1.5)


def test_invalid_unicode_is_found_at_any_depth_in_values_and_keys():
    assert invalid_text({"model": "m", "messages": [{"content": [{"text": "ok"}, {"text": "a\ud800"}]}]}) == (
        "messages[0].content[1].text", 1)
    assert invalid_text({"extra": {"\udc00key": 1}})[0] == "extra.'\\udc00key'"
    assert invalid_text({"x": ["fine \U0001F600", 1, None, 2.5]}) is None
    deep: list = ["\ud800"]
    for _ in range(5000):   # deeper than the recursion limit
        deep = [deep]
    assert invalid_text(deep) == ("[0]" * 5001, 0)


def test_launcher_flags_set_limits_and_per_pipeline_admission():
    from omni_frontend.serve import admission_limits, parse_args

    args = parse_args(["--max-inflight", "2,qwen3_omni=16", "--max-queue", "voice=0", "--max-text-chars", "99"])
    limits = admission_limits(args)
    assert (limits.of("tts"), limits.of("qwen3_omni"), limits.of("voice")) == ((2, 4), (16, 4), (2, 0))
    assert args.max_text_chars == 99
    with pytest.raises(SystemExit):
        parse_args(["--max-inflight", "0"])


def test_the_launcher_waits_for_tritonserver_longer_than_its_exit_timeout():
    """tritonserver runs with --exit-timeout-secs of at least 20 s (5 s left 6 of the 11 models of
    voice,tts,asr,qwen3_omni live on a slow machine, and a stub killed mid-finalize crashed; they took 17.3 s
    on 2 busy cores), and
    TritonServer.stop waits longer than that before its SIGKILL, so a server unloading in time is never killed."""
    import inspect
    from pathlib import Path

    from omni_frontend.tritonserver import TritonInstallation, TritonServer

    server = TritonServer(repositories=[Path("repo")], models=["voice"], grpc_port=1, http_port=2, metrics_port=3,
                          log_path=Path("tritonserver.log"))
    command = server.command(TritonInstallation(Path("tritonserver"), Path("backends"), ()))
    exit_timeout = int(next(a for a in command if a.startswith("--exit-timeout-secs=")).split("=", 1)[1])
    stop_wait = inspect.signature(TritonServer.stop).parameters["timeout_s"].default
    assert exit_timeout >= 20 and stop_wait >= exit_timeout + 5, (exit_timeout, stop_wait)


@pytest.mark.parametrize("fields, model", [(voice_protocol.REQUEST_FIELDS, "voice"),
                                           (omni_turn.REQUEST_FIELDS, "qwen3_omni")])
def test_chat_pipelines_refuse_extension_fields_they_do_not_read(fields, model):
    """Every key the frontend puts in a chat REQUEST is one the chat pipelines read; an extension field a
    pipeline does not read (a typo, another pipeline's knob) is a 400 naming it, never silently dropped."""
    body, _ = to_pipeline(ChatRequest(model=model, messages=USER, temperature=0.5, top_p=0.9, top_k=5, max_tokens=3,
                                      seed=1, stop="x", presence_penalty=0.1, frequency_penalty=0.1,
                                      repetition_penalty=1.1, audio={"voice": "v", "format": "wav"}))
    events.require_known_fields({**body, "first_chunk_words": 2, "talker_hint": None}, fields, model)  # null: absent
    body, _ = to_pipeline(ChatRequest(model=model, messages=USER, talker_top_q=0.5, top_k=5))
    with pytest.raises(RequestError) as info:
        events.require_known_fields(body, fields, model)
    assert (info.value.status, info.value.param, info.value.code) == (400, "talker_top_q", "unsupported_parameter")
    assert info.value.message.startswith(f"talker_top_q is not a request field of model {model} (its fields: ")
    assert "top_k" in info.value.message


def test_each_chat_pipeline_reads_its_own_extensions():
    """talker_* fields are qwen3_omni's, min_tokens the engine's (qwen3_omni passes it on; the voice pipeline
    does not): the voice pipeline refuses them."""
    for name in ("talker_top_p", "min_tokens", "return_token_ids"):
        assert name in omni_turn.REQUEST_FIELDS and name not in voice_protocol.REQUEST_FIELDS
        with pytest.raises(RequestError, match=f"^{name} is not a request field of model voice"):
            events.require_known_fields({"messages": [], name: 1}, voice_protocol.REQUEST_FIELDS, "voice")
