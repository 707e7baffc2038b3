"""The qwen3_omni pipeline end to end: launcher -> tritonserver (thinker, talker, code2wav, BLS
orchestrator; and the co-located layout's one model) -> frontend, driven with the openai SDK, httpx and
tritonclient, compared with transformers' monolithic `Qwen3OmniMoeForConditionalGeneration.generate` on
the tiny checkpoint.

The server runs a copy of model_repository whose code2wav left context covers every previous frame
(and whose chunks are small), so streamed audio must equal one full decode."""
from __future__ import annotations

import base64
import io
import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import psutil
import pytest
import soundfile
from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

from omni_backends.paths import QWEN3_OMNI_TINY, model_home
from omni_backends.qwen3_omni.prompt import PromptBuilder
from tests.qwen3_omni_reference import answer_text
from tests.harness import (MAIN_REPOSITORY, cancel_storm, inflight, metric_value, settle_limit_s, settle_time,
                           start_server, triton_stream, triton_stream_error, wait_for)

pytestmark = pytest.mark.integration

STAGES = ("qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav", "qwen3_omni")
COLOCATED = "qwen3_omni_colocated"   # every engine in one process (deploy `layout: colocated`)
MAX_TOKENS, MAX_FRAMES = 16, 29
GREEDY = {"temperature": 0, "talker_do_sample": False, "talker_repetition_penalty": 1.0,
          "talker_max_frames": MAX_FRAMES, "max_tokens": MAX_TOKENS}
# greedy text and codes: a sampled 4-token answer sometimes ended at its first token, with no audio
_SPEAKS = {"temperature": 0, "talker_do_sample": False}
PCM16_ATOL = 2 / 32768
SAMPLES_PER_FRAME, TRIMMED = 1920, 555
PROMPTS = ["Hello, who are you?", "Tell me a story.", "What is the weather like today?", "Say hello to the world"]
VOICES = ["Ethan", "chelsie", "AIDEN", "ethan"]


@pytest.fixture(scope="module")
def server(omni_chat_server):
    """The session's qwen3_omni server (tests/conftest.py): the stage layout (qwen3_omni and its stage models) and,
    beside it, the co-located layout's model (COLOCATED, model id "colocated"), both with a code2wav left context
    covering every previous frame."""
    return omni_chat_server


@pytest.fixture(scope="module")
def reference():
    ckpt = model_home() / QWEN3_OMNI_TINY   # prepared by the launcher
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt).eval()
    prompts = PromptBuilder(AutoTokenizer.from_pretrained(ckpt), WhisperFeatureExtractor.from_pretrained(ckpt),
                            model.config.thinker_config.audio_config.n_window)
    return model, prompts


_GENERATED: dict = {}


def _generate(reference, messages, voice, audios=()):
    """(token ids, float32 waveform at 24 kHz) of transformers' generate for greedy GREEDY settings (cached:
    both layouts compare with the same answers)."""
    key = (json.dumps(messages), voice, tuple(a.tobytes() for a in audios))
    if key not in _GENERATED:
        _GENERATED[key] = _generate_uncached(reference, messages, voice, audios)
    return _GENERATED[key]


def _generate_uncached(reference, messages, voice, audios):
    model, prompts = reference
    inputs = prompts.build(messages, audios)
    extra = {} if inputs.input_features is None else {"input_features": inputs.input_features,
                                                      "feature_attention_mask": inputs.feature_attention_mask}
    seq, wav = model.generate(input_ids=inputs.input_ids[None], return_audio=True, speaker=voice,
                              thinker_max_new_tokens=MAX_TOKENS, thinker_do_sample=False,
                              thinker_eos_token_id=model.config.im_end_token_id,
                              talker_max_new_tokens=MAX_FRAMES + 1, talker_do_sample=False,
                              talker_repetition_penalty=1.0, **extra)
    return seq[0, len(inputs.input_ids):].tolist(), wav[0, 0].numpy()


def _triton_events(server, body: dict, audio: np.ndarray | None = None,
                   model: str = "qwen3_omni") -> list[tuple[dict, np.ndarray]]:
    """Drive the client-facing Triton model directly (gRPC streaming): every (event, AUDIO) in order."""
    inputs = {"REQUEST": np.array([json.dumps(body).encode()], dtype=np.object_)}
    if audio is not None:
        inputs["INPUT_AUDIO"] = audio.astype(np.float32)
    return [(json.loads(r.as_numpy("EVENT")[0]), r.as_numpy("AUDIO"))
            for r in triton_stream(server.grpc_url, model, inputs, timeout_s=120)]


def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": prompt}]}]


def _assert_matches(events, ids, wav):
    done = events[-1][0]
    assert done["type"] == "done" and done["token_ids"] == ids
    audio = np.concatenate([a for e, a in events if e["type"] == "audio.delta"])
    assert sum(e["type"] == "audio.delta" for e, _ in events) > 3       # streamed in several chunks
    assert audio.shape == wav.shape == (done["usage"]["completion_tokens_details"]["audio_tokens"]
                                        * SAMPLES_PER_FRAME - TRIMMED,)
    np.testing.assert_allclose(audio, wav, atol=1e-5)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768


def test_greedy_answer_matches_generate_through_triton_and_http(server, reference):
    ids, wav = _generate(reference, _messages(PROMPTS[0]), "ethan")
    assert len(ids) == MAX_TOKENS and wav.std() > 0.01
    body = {"messages": _messages(PROMPTS[0]), "voice": "Ethan", "return_token_ids": True, **GREEDY}
    events = _triton_events(server, body)
    _assert_matches(events, ids, wav)
    assert events[-1][0]["finish_reason"] == "length"
    text = answer_text(reference[1].tokenizer, ids)

    client = _client(server)   # non-streamed: one WAV-less pcm16 blob; streamed: PCM16 chunks concatenated
    reply = client.chat.completions.create(model="qwen3_omni", messages=_messages(PROMPTS[0]),
                                           audio={"voice": "Ethan", "format": "pcm16"}, extra_body=GREEDY)
    assert reply.choices[0].message.content == text
    np.testing.assert_allclose(_pcm16(base64.b64decode(reply.choices[0].message.audio.data)), wav,
                               atol=PCM16_ATOL, rtol=1e-3)
    assert reply.usage.completion_tokens_details.audio_tokens == (wav.size + TRIMMED) // SAMPLES_PER_FRAME
    chunks = list(client.chat.completions.create(model="qwen3_omni", messages=_messages(PROMPTS[0]), stream=True,
                                                 audio={"voice": "Ethan", "format": "pcm16"}, extra_body=GREEDY))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    packets = [d.audio for d in deltas if getattr(d, "audio", None) and d.audio.data]
    audio = [base64.b64decode(a.data) for a in packets]
    assert len(audio) > 3 and all(a.sample_rate == 24000 for a in packets)
    assert "".join(d.content or "" for d in deltas) == text
    assert "".join(d.audio.transcript for d in deltas if getattr(d, "audio", None)) == text
    np.testing.assert_allclose(_pcm16(b"".join(audio)), wav, atol=PCM16_ATOL, rtol=1e-3)


def test_four_concurrent_requests_match_generate(server, reference):
    bodies = [{"messages": _messages(p), "voice": v, "return_token_ids": True, **GREEDY}
              for p, v in zip(PROMPTS, VOICES)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: _triton_events(server, b), bodies))
    frames = set()
    for prompt, voice, events in zip(PROMPTS, VOICES, results):
        _assert_matches(events, *_generate(reference, _messages(prompt), voice.lower()))
        frames.add(events[-1][0]["usage"]["completion_tokens_details"]["audio_tokens"])
    assert len(frames) > 1   # answers of different lengths ran together


def test_first_audio_arrives_before_the_last_thinker_token(server):
    body = {"messages": _messages(PROMPTS[1]), "voice": "chelsie", "return_token_ids": True,
            **GREEDY, "max_tokens": 150, "talker_max_frames": 400}
    events = _triton_events(server, body)
    kinds = [e["type"] for e, _ in events]
    first_audio, last_text = kinds.index("audio.delta"), len(kinds) - 1 - kinds[::-1].index("text.delta")
    assert len(events[-1][0]["token_ids"]) == 150
    assert first_audio < last_text
    assert kinds[first_audio:].count("text.delta") > 10   # text kept streaming after the first audio


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_openai_sdk_non_streamed_audio_decodes_to_the_right_length(server, fmt):
    reply = _client(server).chat.completions.create(
        model="qwen3_omni", messages=[{"role": "system", "content": "You are a helpful assistant."},
                                      {"role": "user", "content": PROMPTS[2]}],
        audio={"voice": "aiden", "format": fmt}, max_tokens=12, extra_body={"talker_max_frames": 20, "seed": 7},
        temperature=0.8, top_p=0.9)
    message, usage = reply.choices[0].message, reply.usage
    assert message.content and message.audio.transcript == message.content
    audio, rate = soundfile.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="float32")
    frames = usage.completion_tokens_details.audio_tokens
    assert rate == 24000 and 0 < frames <= 20 and audio.shape == (frames * SAMPLES_PER_FRAME - TRIMMED,)
    assert usage.completion_tokens_details.text_tokens <= 12
    assert usage.completion_tokens == usage.completion_tokens_details.text_tokens + frames


def test_openai_sdk_streamed_pcm16_and_usage(server):
    # sampled (the default), so talker_min_frames keeps the random-weight talker from ending at frame 0
    # (CI at fc39b7e: audio_tokens 0 once)
    chunks = list(_client(server).chat.completions.create(
        model="qwen3_omni", messages=[{"role": "user", "content": PROMPTS[3]}], stream=True,
        stream_options={"include_usage": True}, audio={"voice": "ethan", "format": "pcm16"}, max_tokens=10,
        extra_body={"talker_max_frames": 15, "talker_min_frames": 3}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    pcm = b"".join(base64.b64decode(d.audio.data) for d in deltas if getattr(d, "audio", None) and d.audio.data)
    usage = chunks[-1].usage
    assert "".join(d.content or "" for d in deltas)
    assert 3 <= usage.completion_tokens_details.audio_tokens <= 15
    assert len(pcm) // 2 == usage.completion_tokens_details.audio_tokens * SAMPLES_PER_FRAME - TRIMMED
    assert usage.prompt_tokens > 5 and usage.completion_tokens_details.text_tokens <= 10


def test_audio_only_answer_has_the_text_as_its_transcript(server, reference):
    """modalities ["audio"]: no content, and message.audio.transcript (streamed: the concatenated
    delta.audio.transcript pieces) is exactly the thinker's greedy answer, as in text mode."""
    text = _client(server).chat.completions.create(
        model="qwen3_omni", modalities=["text"], messages=_messages(PROMPTS[2]), extra_body=GREEDY
    ).choices[0].message.content
    kwargs = dict(model="qwen3_omni", modalities=["audio"], audio={"voice": "chelsie", "format": "wav"},
                  messages=_messages(PROMPTS[2]), extra_body=GREEDY)
    message = _client(server).chat.completions.create(**kwargs).choices[0].message
    assert text and message.content is None and message.audio.transcript == text and message.audio.data
    chunks = list(_client(server).chat.completions.create(**{**kwargs, "audio": {"voice": "chelsie", "format": "pcm16"}},
                                                          stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""
    assert "".join(d.audio.transcript for d in deltas if getattr(d, "audio", None)) == text


def test_voices_are_listed_for_the_chat_pipeline(server):
    listed = httpx.get(f"{server.base_url}/v1/audio/voices", params={"model": "qwen3_omni"}, timeout=30).json()
    assert sorted(v["id"] for v in listed["voices"]) == ["aiden", "chelsie", "ethan"]
    assert all(v["model"] == "qwen3_omni" for v in listed["voices"]) and listed["default"] == {"qwen3_omni": "ethan"}
    # unfiltered: every speaking pipeline of this server, the co-located layout (model id "colocated") and the
    # session server's voice pipeline included
    assert httpx.get(f"{server.base_url}/v1/audio/voices", timeout=30).json()["default"] == {
        "qwen3_omni": "ethan", "colocated": "ethan", "voice": "jf_alpha"}


def test_text_only_never_runs_the_audio_stages(server):
    metrics = server.metrics_url
    before = {m: metric_value(metrics, "omni_requests_total", model=m, outcome="ok")
              for m in ("qwen3_omni_talker", "qwen3_omni_code2wav")}
    reply = _client(server).chat.completions.create(model="qwen3_omni", modalities=["text"], max_tokens=8,
                                                    messages=[{"role": "user", "content": PROMPTS[0]}])
    assert reply.choices[0].message.content and reply.choices[0].message.audio is None
    assert reply.usage.completion_tokens_details.audio_tokens == 0
    for model, count in before.items():
        assert metric_value(metrics, "omni_requests_total", model=model, outcome="ok") == count
        assert metric_value(metrics, "omni_inflight_requests", model=model) == 0


def _unending_answer(model: str) -> dict:
    """A streamed spoken answer that only the client's leaving can end early: 250 text tokens and 1000 codec
    frames at least (an answer free to end at end of text and codec sometimes finished, as "ok", before a
    loaded server saw the client leave: CI stop 21)."""
    return {"model": model, "messages": _messages(PROMPTS[1]), "stream": True, "max_tokens": 250,
            "min_tokens": 250, "audio": {"voice": "ethan", "format": "pcm16"}, "talker_max_frames": 1000,
            "talker_min_frames": 1000}


def test_cancelled_stream_stops_every_stage_and_the_next_request_is_served(server):
    metrics = server.metrics_url
    before = metric_value(metrics, "omni_requests_total", model="qwen3_omni", outcome="cancelled") or 0
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=_unending_answer("qwen3_omni"),
                      timeout=60) as response:
        assert response.status_code == 200
        got_audio = False
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("audio"):
                got_audio = True
                break
    assert got_audio
    assert wait_for(lambda: (metric_value(metrics, "omni_requests_total", model="qwen3_omni", outcome="cancelled")
                             or 0) > before, 5)
    for model in STAGES:
        assert wait_for(lambda m=model: metric_value(metrics, "omni_inflight_requests", model=m) == 0, 5), model
    reply = _client(server).chat.completions.create(model="qwen3_omni", messages=_messages(PROMPTS[0]),
                                                    audio={"voice": "ethan", "format": "wav"}, max_tokens=4,
                                                    extra_body={"talker_max_frames": 5, **_SPEAKS})
    assert reply.choices[0].message.audio.data


def _code2wav(server, frames: int, corrid: int, timeout_s: float):
    """One direct qwen3_omni_code2wav request: a whole sequence (START + END) of `frames` zero frames."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    codes = grpcclient.InferInput("CODES", [1, 16, frames], "INT64")
    codes.set_data_from_numpy(np.zeros((1, 16, frames), np.int64))
    try:
        return client.infer("qwen3_omni_code2wav", [codes], sequence_id=corrid, sequence_start=True,
                            sequence_end=True, client_timeout=timeout_s)
    finally:
        client.close()


def test_code2wav_refuses_a_sequence_longer_than_the_talker_can_speak_at_once(server):
    """More frames than the talker's max_frames (4095, 327.6 s) is refused before any decoding: a 400 naming the
    limit, at once (it used to vocode every frame, ~1 min of the one instance on 2 cores)."""
    from tritonclient.utils import InferenceServerException

    started = time.monotonic()
    with pytest.raises(InferenceServerException) as refused:
        _code2wav(server, 4096, 7_100_000_001, timeout_s=30)
    message = refused.value.message()
    assert "too_many_frames" in message, message
    error = json.loads(message[message.index("{"):])
    assert error["error"]["status"] == 400 and error["error"]["param"] == "CODES", error
    assert "4095" in error["error"]["message"] and "4096" in error["error"]["message"], error
    assert time.monotonic() - started < 10
    assert len(_code2wav(server, 4095 - 4090, 7_100_000_002, timeout_s=60).as_numpy("PCM")[0]) > 0


def test_code2wav_serves_string_correlation_ids_as_int_ones(server):
    """A Triton client's string correlation id (tritonclient's sequence_id takes str): code2wav answered a Python
    traceback (int() of the id in _execute, failing the whole batch), and a long one overflowed the UINT64 CORRID
    control and aborted tritonserver. The sequence models read request.correlation_id() and have no CORRID."""
    by_int = _code2wav(server, 5, 7_100_000_003, timeout_s=60).as_numpy("PCM")
    by_string = [_code2wav(server, 5, sequence, timeout_s=60).as_numpy("PCM")
                 for sequence in ("ab", "a-realtime-turn-0123456789abcdef-0123456789")]
    assert by_int.shape[1] > 0 and all(np.array_equal(pcm, by_int) for pcm in by_string)


def test_code2wav_refuses_a_start_beyond_its_live_sequences_at_once(server):
    """Triton's `oldest` sequence batcher cannot refuse: with its slots held by STARTs never ENDed (a leaking direct
    client) a new turn's code2wav sequence waited unanswered for the 120 s idle timeout, and every chat's speech
    with it. Now the stage serves `max_sequences` (256) live sequences and refuses the next START at once (429
    `too_many_sequences`), Triton keeping 16x more slots; a sequence ENDed makes room for a new one. The talker
    and voice_vad take the same check (`sequences.check_room`; voice_vad's test is in test_realtime.py)."""
    import re

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    text = (MAIN_REPOSITORY / "qwen3_omni_code2wav" / "config.pbtxt").read_text()
    live = int(re.search(r'key: "max_sequences" value \{ string_value: "(\d+)"', text).group(1))
    assert int(re.search(r"max_candidate_sequences: (\d+)", text).group(1)) >= 16 * live
    assert 'key: "max_sequences" value { string_value: "%d" }' % live in (
        MAIN_REPOSITORY / "qwen3_omni_talker" / "config.pbtxt").read_text()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    base = 7_200_000_000

    def feed(corrid, start=False, end=False):
        codes = grpcclient.InferInput("CODES", [1, 16, 0], "INT64")
        codes.set_data_from_numpy(np.zeros((1, 16, 0), np.int64))
        return client.infer("qwen3_omni_code2wav", [codes], sequence_id=corrid, sequence_start=start,
                            sequence_end=end, client_timeout=30)

    opened = []
    try:
        for corrid in range(base, base + live):
            feed(corrid, start=True)
            opened.append(corrid)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as refused:
            feed(base + live, start=True)
        message = refused.value.message()
        error = json.loads(message[message.index("{"):])["error"]
        assert error["code"] == "too_many_sequences" and error["status"] == 429 and str(live) in error["message"]
        assert time.monotonic() - started < 10
        feed(opened.pop(0), end=True)
        feed(base + live + 1, start=True, end=True)   # room again
    finally:
        for corrid in [base + live, *opened]:
            try:
                feed(corrid, end=True)
            except InferenceServerException:
                pass   # the refused one is not live: its END only frees the Triton slot
        client.close()
    assert wait_for(lambda: metric_value(server.metrics_url, "omni_inflight_requests",
                                         model="qwen3_omni_code2wav") == 0, 10)


def test_code2wav_stops_a_request_whose_client_left_and_serves_the_next_one(server):
    """A long direct request whose client deadline passes stops between decode pieces: the next sequence is
    answered within seconds, not after the abandoned frames were all vocoded (~40 s on 2 cores)."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="(?i)deadline"):
        _code2wav(server, 3000, 7_100_000_003, timeout_s=2)
    started = time.monotonic()
    assert len(_code2wav(server, 5, 7_100_000_004, timeout_s=120).as_numpy("PCM")[0]) > 0
    assert time.monotonic() - started < 15, "the abandoned request kept the stage busy"
    assert wait_for(lambda: (metric_value(server.metrics_url, "omni_requests_total", model="qwen3_omni_code2wav",
                                          outcome="cancelled") or 0) >= 1, 10)
    assert wait_for(lambda: metric_value(server.metrics_url, "omni_inflight_requests",
                                         model="qwen3_omni_code2wav") == 0, 10)


@pytest.mark.parametrize("change, param", [
    ({"messages": []}, "messages"),
    ({"audio": {"voice": "nobody", "format": "wav"}}, "voice"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 10**9, "modalities": ["text"]}, "max_tokens"),   # beyond the thinker's context length
    ({"seed": 2**70}, "seed"),
    ({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio").decode(), "format": "wav"}}]}]},
     "messages[0].content[0].input_audio"),
])
def test_bad_input_is_a_400_with_the_openai_error_shape(server, change, param):
    body = {"model": "qwen3_omni", "messages": _messages("hi"), "max_tokens": 4, "talker_max_frames": 4, **change}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param in (error["param"] or "") or param in error["message"]
    if param == "voice":
        assert "aiden, chelsie, ethan" in error["message"]
    ok = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                    json={"model": "qwen3_omni", "messages": _messages("hi"), "max_tokens": 2, "modalities": ["text"]})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("model", ["qwen3_omni", "colocated"])
def test_bad_talker_values_are_a_400_that_logs_no_server_error(server, model):
    """A bad talker_* value fails the talker's START request: a 400 naming the field, and no clean-up error
    in the server log (the stage layout used to open a code2wav sequence for the talker's zero frames and then
    ABORT it, which Triton refused as a sequence without START: an error line per bad request)."""
    log = server.log_path.parent / "tritonserver.log"
    before = log.read_text(errors="replace").count("aborting the")
    for field, value in (("talker_top_p", 0), ("talker_repetition_penalty", 0), ("talker_temperature", -1)):
        response = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
            "model": model, "messages": _messages("hi"), "max_tokens": 4, field: value,
            "audio": {"voice": "chelsie", "format": "wav"}})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == field
    time.sleep(0.5)   # the orchestrator's clean-up runs after the response
    assert log.read_text(errors="replace").count("aborting the") == before


@pytest.mark.parametrize("model", ["qwen3_omni", "colocated"])
def test_a_field_neither_layout_reads_is_refused_by_the_route_naming_it(server, model):
    """Both layouts publish turn.REQUEST_FIELDS ({"action": "fields"}): the route refuses a typo before admission
    and lists the talker_* extensions among the fields."""
    response = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": model, "messages": _messages("hi"), "max_tokens": 2, "modalities": ["text"], "talker_top_p": 0.9,
        "talker_top_q": 0.5})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("talker_top_q", "unsupported_parameter")
    assert error["message"].startswith(f"talker_top_q is not a request field of POST /v1/chat/completions with model "
                                       f"{model} (its fields: ")
    assert "talker_top_p" in error["message"] and "return_token_ids" in error["message"]




@pytest.mark.parametrize("model", ["qwen3_omni", COLOCATED, "qwen3_omni_thinker"])
def test_wrong_json_shapes_and_non_finite_audio_sent_to_the_models_are_a_400_envelope(server, model):
    """Straight to the Triton models (no frontend validation): a REQUEST of well-formed JSON of the wrong shape
    and NaN input audio are a 400 OpenAI envelope naming the field (not a Python exception: a 500 and a traceback),
    in both layouts and from the thinker stage itself; the model keeps serving."""
    nan = np.full(16000, np.nan, np.float32)
    part = {"type": "input_audio", "offset": 0, "samples": nan.size, "sample_rate": 16000}
    base = {"modalities": ["text"], "max_tokens": 4} if model != "qwen3_omni_thinker" else {"max_tokens": 4,
                                                                                           "talker_inputs": False}
    for body, audio, param in (
            ({"messages": [1]}, None, "messages[0]"),
            ({"messages": [{"role": "user", "content": [5]}]}, None, "messages[0].content[0]"),
            ({"messages": [{"role": "user", "content": [{**part, "offset": "a"}]}]}, None,
             "messages[0].content[0].offset"),
            ({"messages": [{"role": "user", "content": [{"type": "text", "text": ["hi"]}]}]}, None,
             "messages[0].content[0].text"),
            ({"messages": _messages("hi"), "stop": {"s": 1}}, None, "stop"),
            ({"messages": [{"role": "user", "content": [part]}]}, nan, "INPUT_AUDIO")):
        message = triton_stream_error(server.grpc_url, model, {**base, **body},
                                      np.zeros(16000, np.float32) if audio is None else audio)
        assert message is not None, f"{model} answered {body}"
        error = json.loads(message)["error"]
        assert (error["status"], error["type"], error["param"]) == (400, "invalid_request_error", param), error
    assert triton_stream_error(server.grpc_url, model, {**base, "messages": _messages("hi")}, np.zeros(16000, np.float32)) is None


def test_input_audio_runs_through_the_audio_encoder(server, reference):
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(16000) / 16000)).astype(np.float32)
    wav_bytes = io.BytesIO()
    soundfile.write(wav_bytes, tone, 16000, format="WAV", subtype="FLOAT")
    messages = [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes.getvalue()).decode(),
                                                "format": "wav"}},
        {"type": "text", "text": "What did I say?"}]}]
    reply = _client(server).chat.completions.create(model="qwen3_omni", messages=messages,
                                                    audio={"voice": "aiden", "format": "wav"}, extra_body=GREEDY)
    ids, wav = _generate(reference, messages, "aiden", audios=[tone])
    text_only = _generate(reference, _messages("What did I say?"), "aiden")[0]
    assert ids != text_only   # the audio changed the answer
    assert reply.choices[0].message.content == answer_text(reference[1].tokenizer, ids)
    audio, rate = soundfile.read(io.BytesIO(base64.b64decode(reply.choices[0].message.audio.data)), dtype="float32")
    assert rate == 24000
    np.testing.assert_allclose(audio, wav, atol=PCM16_ATOL, rtol=1e-3)
    prompt_without_audio = len(reference[1].build(_messages("What did I say?")).input_ids)
    assert reply.usage.prompt_tokens == prompt_without_audio + 13 + 2   # 1 s -> 13 placeholders + start/end


# ---------------------------------------------------------------- the co-located layout (one process)

def test_colocated_layout_gives_generates_answers_to_concurrent_requests(server, reference):
    """Two requests at once through the co-located model: the same tokens and audio as generate (and as the
    stage layout); text deltas merged per batch still decode to the same text."""
    bodies = [{"messages": _messages(p), "voice": v, "return_token_ids": True, **GREEDY}
              for p, v in zip(PROMPTS[:2], VOICES[:2])]
    first_audio = {phase: metric_value(server.metrics_url, "omni_first_audio_phase_seconds_count", model=COLOCATED,
                                       phase=phase) or 0 for phase in ("total", "thinker_prefill", "code2wav")}
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda b: _triton_events(server, b, model=COLOCATED), bodies))
    for prompt, voice, events in zip(PROMPTS, VOICES, results):
        ids, wav = _generate(reference, _messages(prompt), voice.lower())
        _assert_matches(events, ids, wav)
        assert "".join(e["text"] for e, _ in events if e["type"] == "text.delta") == \
            answer_text(reference[1].tokenizer, ids)
    for phase, count in first_audio.items():   # each request's first-audio timeline reached the histograms
        assert metric_value(server.metrics_url, "omni_first_audio_phase_seconds_count", model=COLOCATED,
                            phase=phase) == count + 2, phase
    assert metric_value(server.metrics_url, "omni_first_audio_phase_seconds_sum", model=COLOCATED, phase="total") > 0


def test_colocated_layout_stop_string_cancellation_and_errors(server, reference):
    ids, _ = _generate(reference, _messages(PROMPTS[0]), "ethan")
    full = reference[1].tokenizer.decode(ids, skip_special_tokens=True)
    body = {"messages": _messages(PROMPTS[0]), "voice": "ethan", "stop": [full.split()[2]], "return_token_ids": True,
            **GREEDY}
    answers = []
    for model in (COLOCATED, "qwen3_omni"):   # the talker speaks the same text (up to the stop) in both layouts
        events = _triton_events(server, body, model=model)
        done, text = events[-1][0], "".join(e["text"] for e, _ in events if e["type"] == "text.delta")
        assert done["finish_reason"] == "stop" and full.split()[2] not in text and full.startswith(text)
        assert done["token_ids"] == ids[:len(done["token_ids"])] and len(done["token_ids"]) < len(ids)
        # the audio events' transcripts concatenate to the spoken text in both layouts
        assert "".join(e["transcript"] for e, _ in events if e["type"] == "audio.delta") == text
        answers.append((text, done["usage"], np.concatenate([a for e, a in events if e["type"] == "audio.delta"])))
    assert answers[0][:2] == answers[1][:2]
    np.testing.assert_allclose(answers[0][2], answers[1][2], atol=1e-5)

    metrics = server.metrics_url
    before = metric_value(metrics, "omni_requests_total", model=COLOCATED, outcome="cancelled") or 0
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=_unending_answer("colocated"),
                      timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("audio"):
                break
    assert wait_for(lambda: (metric_value(metrics, "omni_requests_total", model=COLOCATED, outcome="cancelled")
                             or 0) > before, 5)
    assert wait_for(lambda: metric_value(metrics, "omni_inflight_requests", model=COLOCATED) == 0, 5)
    bad = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                     json={"model": "colocated", "messages": _messages("hi"), "audio": {"voice": "nobody"}})
    assert bad.status_code == 400 and "aiden, chelsie, ethan" in bad.json()["error"]["message"]
    reply = _client(server).chat.completions.create(model="colocated", messages=_messages(PROMPTS[0]),
                                                    audio={"voice": "ethan", "format": "wav"}, max_tokens=4,
                                                    extra_body={"talker_max_frames": 5, "talker_min_frames": 5})
    # min = max: a sampled talker may pick codec_eos before its 5th frame (CI, 2026-12-02: 4 frames)
    assert reply.choices[0].message.audio.data and reply.usage.completion_tokens_details.audio_tokens == 5


def test_extreme_thinker_and_talker_sampling_values_are_served(server):
    """Thinker, talker (code group 0) and code predictor at the edges of their accepted values: served,
    and no worker loop crashed."""
    extremes = [{"temperature": 1e-40, "talker_temperature": 1e-40},
                {"temperature": 2.0, "top_p": 1e-300, "talker_top_p": 1e-300, "talker_temperature": 2.0},
                {"top_k": 10**9, "talker_top_k": 10**9, "talker_repetition_penalty": 1e30},
                {"repetition_penalty": 1e-30, "talker_repetition_penalty": 1e-30, "seed": -2**63},
                {"presence_penalty": 2.0, "frequency_penalty": -2.0, "talker_do_sample": False, "seed": 2**63 - 1}]

    def ask(values):
        return httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
            "model": "qwen3_omni", "messages": _messages("hi"), "max_tokens": 4, "talker_max_frames": 6,
            "audio": {"voice": "ethan", "format": "pcm16"}, **values})

    with ThreadPoolExecutor(len(extremes)) as pool:
        replies = list(pool.map(ask, extremes))
    assert [r.status_code for r in replies] == [200] * len(extremes), [r.text for r in replies]
    for model in ("qwen3_omni_thinker", "qwen3_omni_talker"):
        assert metric_value(server.metrics_url, "omni_worker_restarts_total", model=model) == 0
    too_long = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60, json={
        "model": "qwen3_omni", "messages": _messages("hi"), "max_tokens": 2, "talker_max_frames": 10**6,
        "audio": {"voice": "ethan", "format": "wav"}})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "talker_max_frames"


def test_qwen3_cancel_storm_leaves_every_gauge_and_sequence_at_zero(server):
    """100 streamed turns (text and speech) cancelled mid-way: thinker, talker and code2wav sequences all
    end within 2 s (the talker/code2wav sequences of cancelled turns used to stay alive for good)."""
    body = {"model": "qwen3_omni", "messages": _messages(PROMPTS[1]), "max_tokens": 200, "talker_max_frames": 400,
            "audio": {"voice": "ethan", "format": "pcm16"}}
    last_close = cancel_storm(server.base_url, body, n=100)
    settled = settle_time(server.metrics_url, last_close)
    print(f"qwen3_omni cancel storm: gauges at 0 {settled} s after the last close")
    assert settled is not None and settled <= settle_limit_s(), inflight(server.metrics_url)


def test_a_killed_orchestrator_stops_every_stage_within_seconds(server):
    """kill -9 of the qwen3_omni stub while two answers stream (thinker rows, talker and code2wav
    sequences open): every stage sees its BLS parent's process gone and ends that work within a few
    seconds (the sequences used to live until the 120 s idle timeout and the gauges stayed up, after a
    crash or a reload of a hung orchestrator), and the reloaded orchestrator serves the next answer."""
    metrics = server.metrics_url
    victim = next(p for p in psutil.Process(server.process.pid).children(recursive=True)
                  if p.cmdline()[1:2] and p.cmdline()[1].endswith("/qwen3_omni/1/model.py"))
    body = {"model": "qwen3_omni", "messages": _messages(PROMPTS[1]), "stream": True, "max_tokens": 250,
            "audio": {"voice": "ethan", "format": "pcm16"}, "talker_max_frames": 1000}
    speaking = threading.Semaphore(0)

    def answer() -> list[str]:   # the stream's lines; releases `speaking` at its first audio
        lines, spoke = [], False
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                lines.append(line)
                if not spoke and line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("audio"):
                    spoke = True
                    speaking.release()
        return lines

    with ThreadPoolExecutor(2) as pool:
        answers = [pool.submit(answer) for _ in range(2)]
        assert speaking.acquire(timeout=60) and speaking.acquire(timeout=60)
        assert any(inflight(metrics)[m] for m in STAGES[:3]), inflight(metrics)   # (a talker may end early)
        os.kill(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        stopped = wait_for(lambda: not any(inflight(metrics).get(m) for m in STAGES[:3]), 30, 0.05)
        stopped_after = time.monotonic() - killed
        streams = [a.result() for a in answers]
    print(f"stages of the killed orchestrator stopped {stopped_after:.2f} s after the kill")
    assert stopped and stopped_after <= settle_limit_s(3.0), inflight(metrics)
    assert any(any("model_unavailable" in line for line in lines) for lines in streams)   # failed, not hung
    assert wait_for(lambda: httpx.get(f"{server.base_url}/health").status_code == 200, 120, 0.2)
    reply = _client(server).chat.completions.create(model="qwen3_omni", messages=_messages(PROMPTS[0]),
                                                    audio={"voice": "ethan", "format": "wav"}, max_tokens=4,
                                                    extra_body={"talker_max_frames": 5, **_SPEAKS})
    assert reply.choices[0].message.audio.data


def test_a_colocated_deploy_is_healthy_and_sleeps_its_one_model(tmp_path):
    """`--deploy` with `layout: colocated` loads one model; /health, /v1/models and sleep/wake follow it (they
    looked for the stage models, which that layout never loads: /health stayed 503 for good).
    Sixteenth outside test: the server rendered into var/deploy/<name>/ and reloaded from there on a wake or a stage
    recovery, so any later render of a file of that name (render-only, or a second serve that then failed its port
    check) replaced the running server's models. It now serves a run folder of its own, removed at the stop: a wake
    after another render of the same name still loads what the server started with."""
    from omni_frontend import deploy

    name = f"test_colocated_health_{os.getpid()}"
    deploy_file, other = tmp_path / f"{name}.yaml", tmp_path / "other" / f"{name}.yaml"
    deploy_file.write_text("pipeline: qwen3_omni\nlayout: colocated\ncheckpoint: qwen3_omni_tiny\n"
                           "stages: {thinker: {device: cpu, engine: static, max_running: 2, max_len: 256}, "
                           "talker: {device: cpu, engine: static, max_running: 2, max_len: 512}, "
                           "code2wav: {device: cpu}, orchestrator: {device: cpu}}\n")
    other.parent.mkdir()
    other.write_text("pipeline: qwen3_omni\nlayout: colocated\ncheckpoint: qwen3_omni_30b_a3b_random\n")
    rendered = deploy.ROOT / "var" / "deploy"
    server = start_server(tmp_path, "--deploy", str(deploy_file), ready_timeout_s=240)   # waits for /health 200
    try:
        assert len(list(rendered.glob(f"{name}.run-*/qwen3_omni/config.pbtxt"))) == 1
        health = httpx.get(f"{server.base_url}/health").json()
        assert health["models"] == ["qwen3_omni"], health
        (entry,) = httpx.get(f"{server.base_url}/v1/models").json()["data"]
        assert entry["triton_models"] == ["qwen3_omni"] and entry["state"] == "awake"
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
            "model": "qwen3_omni", "max_tokens": 4, "modalities": ["text"], "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
        # Sixteenth outside test: past the static talker's 2 slots a spoken chat was a 500 ("the talker holds its
        # maximum of 2 requests"); it now waits for a slot: 4 at once (the frontend admits 4) all speak
        spoken = {"model": "qwen3_omni", "max_tokens": 6, "min_tokens": 6, "talker_max_frames": 4, **_SPEAKS,
                  "modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda p: httpx.post(f"{server.base_url}/v1/chat/completions", timeout=300,
                                                         json={**spoken, "messages": _messages(p)}), PROMPTS))
        for spoken_reply in replies:
            assert spoken_reply.status_code == 200, spoken_reply.text
            body = spoken_reply.json()
            wav, rate = soundfile.read(io.BytesIO(base64.b64decode(body["choices"][0]["message"]["audio"]["data"])))
            assert rate == 24000 and len(wav) > 0 and np.abs(wav).max() > 0
            assert body["usage"]["completion_tokens_details"]["audio_tokens"] == 4
        assert deploy.main([str(other)]) == 0   # renders var/deploy/<name>/: the 30B checkpoint, not for this CPU
        for action, state in (("sleep", "sleeping"), ("wake", "awake")):
            done = httpx.post(f"{server.base_url}/v1/admin/pipelines/qwen3_omni/{action}", timeout=240)
            assert done.status_code == 200, done.text
            assert httpx.get(f"{server.base_url}/v1/models").json()["data"][0]["state"] == state
        assert wait_for(lambda: httpx.get(f"{server.base_url}/health").status_code == 200, 60)
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
            "model": "qwen3_omni", "max_tokens": 4, "modalities": ["text"], "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200, reply.text
    finally:
        server.stop()
        shutil.rmtree(rendered / name, ignore_errors=True)
    assert not list(rendered.glob(f"{name}.run-*"))   # the run folder went with the server


def test_a_stop_after_the_talker_finished_before_the_text_does_not_wait_for_its_sequence(tmp_path):
    """The talker may finish (codec_eos, talker_max_frames) before the thinker's text ends, so before the
    orchestrator sent the talker sequence's END: Triton kept the sequence's slot until its 120 s idle timeout, and
    tritonserver counts a held slot as an in-flight inference, so Ctrl-C within those 120 s (also during a speech
    stream, the outside test's finding: 32-38 s) sat out the whole 30 s exit timeout ("Model 'qwen3_omni_talker'
    (version 1) has 1 in-flight inferences") and killed every stub unfinalized. The orchestrator now ENDs (ABORT)
    such a sequence at once, and at the end of any turn that leaves one open."""
    from omni_frontend.tritonserver import EXIT_TIMEOUT_S

    server = start_server(tmp_path, "--pipelines", "qwen3_omni")
    early_end = {"max_tokens": 40, "min_tokens": 40, "talker_max_frames": 2, **_SPEAKS}
    try:
        reply = _client(server).chat.completions.create(model="qwen3_omni", messages=_messages(PROMPTS[1]),
                                                        audio={"voice": "ethan", "format": "wav"},
                                                        extra_body=early_end)   # the talker ends first
        assert reply.choices[0].message.audio.data and reply.usage.completion_tokens_details.audio_tokens == 2
        body = {"model": "qwen3_omni", "messages": _messages(PROMPTS[1]), "stream": True, "max_tokens": 250,
                "min_tokens": 250, "audio": {"voice": "ethan", "format": "pcm16"}, **early_end}
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():   # Ctrl-C while the text streams on after the talker finished
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("audio"):
                    break
            started = time.monotonic()
            server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=EXIT_TIMEOUT_S + 30) == 130
        took = time.monotonic() - started
    finally:
        server.stop()
    log = (tmp_path / "tritonserver.log").read_text(errors="replace")
    assert "in-flight inferences" in log   # the stop's own check ran
    assert "Exit timeout expired" not in log and "has 1 in-flight inferences" not in log
    assert "Non-graceful termination" not in log
    assert took < EXIT_TIMEOUT_S - 5, took   # an idle stop takes ~8 s here; the exit timeout is 30 s


def test_stream_options_without_stream_and_a_bad_audio_voice_are_400s_naming_the_request_field(server):
    """Twelfth outside test: `stream_options` on a chat that is not streamed (and on a batch, never streamed) was a
    200 that dropped it (OpenAI and vLLM refuse it); an unknown `audio.voice` was a 400 naming `voice`, the pipeline
    REQUEST's key, which a chat request does not have (single, streamed and batched chats alike)."""
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="qwen3_omni", messages=_messages("hi"), max_tokens=3, modalities=["text"],
                                       stream_options={"include_usage": True})
    assert refused.value.response.json()["error"]["param"] == "stream_options"
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="qwen3_omni", messages=_messages("hi"), max_tokens=3, stream=stream,
                                           modalities=["text", "audio"], audio={"voice": "nope", "format": "wav"})
        error = refused.value.response.json()["error"]
        assert error["param"] == "audio.voice" and "ethan" in error["message"], (stream, error)
    batch = {"model": "qwen3_omni", "max_tokens": 3, "messages": [_messages("hi"), _messages("yo")]}
    for change, param in (({"stream_options": {"include_usage": True}, "modalities": ["text"]}, "stream_options"),
                          ({"audio": {"voice": "nope", "format": "wav"}}, "audio.voice")):
        response = httpx.post(f"{server.base_url}/v1/chat/completions/batch", json={**batch, **change}, timeout=120)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    ok = client.chat.completions.create(model="qwen3_omni", messages=_messages("hi"), max_tokens=3, stream=True,
                                        modalities=["text"], stream_options={"include_usage": True})
    assert [chunk.usage.completion_tokens for chunk in ok if chunk.usage] == [3]


def test_ordinary_requests_wait_one_item_not_whole_batches_that_hold_every_slot(server):
    """Twelfth outside test: four chat batches of 32 conversations held the pipeline's four slots for all their
    items (a batch gave back only the extra slots it took), so an ordinary chat waited for a whole batch to end
    (or 30 s, then 429 `queue_timeout`). A batch's own slot now passes to a waiting request between two items
    (`Ticket.take_turn`): the ordinary chat is answered while every batch still has items to run."""
    user = _messages("Tell me a long story.")
    ended: list[tuple[int, float]] = []

    def batch():
        response = httpx.post(f"{server.base_url}/v1/chat/completions/batch", timeout=600, json={
            "model": "qwen3_omni", "modalities": ["text"], "max_tokens": 32, "messages": [user] * 32})
        ended.append((response.status_code, time.perf_counter()))

    threads = [threading.Thread(target=batch) for _ in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    time.sleep(1.0)
    single = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=300, json={
        "model": "qwen3_omni", "modalities": ["text"], "max_tokens": 32, "messages": user})
    answered = time.perf_counter()
    for thread in threads:
        thread.join()
    assert single.status_code == 200, single.text
    assert [status for status, _ in ended] == [200] * 4
    assert all(at > answered for _, at in ended), [round(at - answered, 2) for _, at in ended]
