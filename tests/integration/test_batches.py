"""POST /v1/audio/speech/batch and /v1/chat/completions/batch: the real `tts` pipeline (Kokoro) speaks each item,
transcribed back by the server's Whisper, and the real `voice` LLM answers each conversation as a single request
does; the framework's mock pipelines show the batches' errors, their slots and their cancellation."""
from __future__ import annotations

import base64
import io
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.harness import metric_value, settle_limit_s, settle_time, wait_for
from tests.integration.test_realtime import transcribe

pytestmark = pytest.mark.integration


def _batch(server, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/audio/speech/batch", json=body, timeout=timeout)


def test_each_item_is_spoken_in_its_format_and_a_bad_item_fails_alone(voice_server):
    response = _batch(voice_server, {"model": "tts", "voice": "alloy", "response_format": "pcm", "items": [
        {"input": "The weather is sunny today.", "response_format": "wav", "model": "tts-1"},   # an alias of tts
        {"input": "   "},
        {"input": "We walk to the park.", "voice": "nope"},
        {"input": "Good night, see you tomorrow.", "response_format": "flac", "speed": 1.5},
        {"input": "Bring the green apples home."},
        {"input": "Fields the pipeline does not read fail their item.", "nonsense": 1}]})
    assert response.status_code == 200, response.text
    batch = response.json()
    assert batch["id"].startswith("speech-batch-") and (batch["total"], batch["succeeded"], batch["failed"]) == (6, 3, 3)
    results = batch["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3, 4, 5]
    assert [r["status"] for r in results] == ["success", "error", "error", "success", "success", "error"]
    assert (results[5]["error"]["param"], results[5]["error"]["code"]) == ("items[5].nonsense", "unsupported_parameter")
    assert (results[1]["error"]["param"], results[1]["error"]["code"]) == ("items[1].input", "empty_input")
    assert results[2]["error"]["param"] == "items[2].voice" and "nope" in results[2]["error"]["message"]
    assert [results[i]["media_type"] for i in (0, 3, 4)] == ["audio/wav", "audio/flac", "audio/pcm"]
    assert all(results[i]["usage"]["input_tokens"] > 0 for i in (0, 3, 4))

    wav, rate = sf.read(io.BytesIO(base64.b64decode(results[0]["audio_data"])))
    assert rate == 24000 and 1.0 < wav.size / rate < 5 and np.abs(wav).max() > 0.05, wav.size   # speech, not silence
    flac, rate = sf.read(io.BytesIO(base64.b64decode(results[3]["audio_data"])))
    assert rate == 24000 and np.abs(flac).max() > 0.05
    # speed 1.5 against the same text at speed 1 through /v1/audio/speech
    single = httpx.post(f"{voice_server.base_url}/v1/audio/speech", timeout=120, json={
        "model": "tts", "voice": "alloy", "input": "Good night, see you tomorrow.", "response_format": "pcm"})
    assert 0.5 < flac.size / (len(single.content) / 2) < 0.85
    pcm = base64.b64decode(results[4]["audio_data"])
    heard = transcribe(voice_server, pcm).lower()
    assert all(word in heard for word in ("green", "apples", "home")), heard
    heard = transcribe(voice_server, (wav * 32767).astype("<i2").tobytes()).lower()
    assert "weather" in heard and "sunny" in heard, heard

    # the same field at the batch level refuses the whole batch before any item is spoken
    response = _batch(voice_server, {"model": "tts", "voice": "alloy", "nonsense": 1, "items": [{"input": "Hi."}]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "nonsense", response.text


@pytest.mark.parametrize("body, param, code", [
    ({"items": []}, "items", "invalid_value"),
    ({"items": [{"input": "hi"}] * 33}, "items", "too_many_items"),
    ({"items": [{"input": "x" * 4096}] * 5}, "items", "input_too_long"),
    ({"items": [{"input": "x" * 4096, "speed": 0.25}, {"input": "more"}]}, "items", "input_too_long"),
    ({"items": [{"input": "hi"}], "input": "hello"}, "input", "unsupported_parameter"),
    ({"items": [{"input": "hi"}], "instructions": "whisper"}, "instructions", "unsupported_parameter"),
    ({"items": ["hi"]}, "items.0", "invalid_value"),
    ({"items": [{"input": "hi"}], "stream_format": "sse"}, "stream_format", "unsupported_parameter"),
    ({"items": [{"input": "hi"}], "speed": 9}, "speed", "invalid_value"),
])
def test_a_malformed_batch_is_refused_whole(mock_server, body, param, code):
    response = _batch(mock_server, {"model": "mock-speech", "voice": "alloy", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code) and error["type"] == "invalid_request_error", error


def test_item_failures_slots_and_a_leaving_client_on_the_mock_pipeline(mock_server):
    response = _batch(mock_server, {"model": "mock-speech", "voice": "alloy", "response_format": "wav", "items": [
        {"input": "a", "repeat": 2}, {"input": "b", "reject": True}, {"input": "c", "fail_at": 0},
        {"input": "d", "model": "mock"}, {"input": "e", "stream_format": "sse"}, {"voice": "echo"}]})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert results[0]["status"] == "success"
    wav, rate = sf.read(io.BytesIO(base64.b64decode(results[0]["audio_data"])), dtype="float32")
    assert rate == 24000 and wav.size == 200   # the mock speaks a 100-sample ramp per delta
    errors = [(r["error"]["param"], r["error"]["code"]) for r in results[1:]]
    assert errors == [("items[1].reject", "mock"), (None, "inference_error"), ("items[3].model", "model_mismatch"),
                      ("items[4].stream_format", "unsupported_parameter"), ("items[5].input", "invalid_value")]

    # An idle pipeline: the items run at once on free slots (here 4 of them), which are given back at the end.
    peak, done = [0.0], threading.Event()

    def watch():
        while not done.is_set():
            value = metric_value(mock_server.base_url + "/metrics", "omni_frontend_inflight_requests",
                                 pipeline="mock-speech") or 0
            peak[0] = max(peak[0], value)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    slow = [{"input": str(i), "repeat": 1, "delay_ms": 1500} for i in range(4)]
    try:
        response = _batch(mock_server, {"model": "mock-speech", "voice": "alloy", "items": slow})
    finally:
        done.set()
        watcher.join()
    assert response.json()["succeeded"] == 4 and peak[0] == 4
    assert metric_value(mock_server.base_url + "/metrics", "omni_frontend_inflight_requests",
                        pipeline="mock-speech") == 0

    # A request that queues behind a batch gets a slot once an item ends, not once the batch ends.
    finished: dict[str, float] = {}

    def run_batch():
        items = [{"input": str(i), "repeat": 1, "delay_ms": 600} for i in range(8)]
        assert _batch(mock_server, {"model": "mock-speech", "voice": "alloy", "items": items}).json()["succeeded"] == 8
        finished["batch"] = time.monotonic()

    batch_thread = threading.Thread(target=run_batch)
    batch_thread.start()
    assert wait_for(lambda: metric_value(mock_server.base_url + "/metrics", "omni_frontend_inflight_requests",
                                         pipeline="mock-speech") == 4, 10)
    single = httpx.post(f"{mock_server.base_url}/v1/audio/speech", timeout=60, json={
        "model": "mock-speech", "voice": "alloy", "input": "x", "repeat": 1})
    finished["single"] = time.monotonic()
    batch_thread.join()
    assert single.status_code == 200 and finished["single"] < finished["batch"]

    # A client that leaves cancels every item still running in Triton.
    with pytest.raises(httpx.ReadTimeout):
        _batch(mock_server, {"model": "mock-speech", "voice": "alloy", "items": [
            {"input": str(i), "repeat": 100, "delay_ms": 200} for i in range(3)]}, timeout=1.0)
    settled = settle_time(mock_server.metrics_url, time.monotonic())
    assert settled is not None and settled < settle_limit_s(), settled


def test_a_chat_batch_answers_each_conversation_as_a_single_request_does(voice_server):
    conversations = [[{"role": "user", "content": "Name a fruit."}],
                     [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+2?"}],
                     [{"role": "user", "content": "Say hello."}]]
    common = {"model": "voice", "modalities": ["text"], "temperature": 0, "max_tokens": 12}
    response = httpx.post(f"{voice_server.base_url}/v1/chat/completions/batch", timeout=120,
                          json={**common, "messages": conversations})
    assert response.status_code == 200, response.text
    batch = response.json()
    singles = [httpx.post(f"{voice_server.base_url}/v1/chat/completions", timeout=120,
                          json={**common, "messages": c}).json() for c in conversations]
    assert batch["object"] == "chat.completion" and [c["index"] for c in batch["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in batch["choices"]] == [s["choices"][0]["message"]["content"] for s in singles]
    assert [c["finish_reason"] for c in batch["choices"]] == [s["choices"][0]["finish_reason"] for s in singles]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert batch["usage"][key] == sum(s["usage"][key] for s in singles) > 0


@pytest.mark.parametrize("body, status, param", [
    ({"messages": [[{"role": "user", "content": "hi"}]], "stream": True}, 400, "stream"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [[]]}, 400, "messages.0"),
    ({"messages": [[{"role": "user", "content": ["hi"]}]]}, 400, "messages.0.0.content"),   # was ...content.str
    ({"messages": [[{"role": "user", "content": "hi"}]] * 33}, 400, "messages"),
    ({"messages": [[{"role": "user", "content": "hi"}], [{"role": "user", "content": [{"type": "input_audio",
      "input_audio": {"data": "!!", "format": "wav"}}]}]]}, 400, "messages[1][0].content[0].input_audio"),
    ({"messages": [[{"role": "user", "content": "hi"}]], "model": "nope"}, 404, "model"),
    ({"messages": [[{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "x"}]]}, 400, "messages[1]"),
    # the request limits hold for the batch as a whole (--max-messages 512)
    ({"messages": [[{"role": "user", "content": "hi"}] * 300] * 2}, 400, "messages"),   # was "the limit is 212"
    ({"messages": [[{"role": "user", "content": "x" * 100_000}], [{"role": "user", "content": "y" * 40_000}]]}, 400,
     "messages[1][0].content"),   # the text limit (--max-text-chars 131072) left by conversation 0
])
def test_a_malformed_chat_batch_is_refused_whole(mock_server, body, status, param):
    response = httpx.post(f"{mock_server.base_url}/v1/chat/completions/batch", timeout=30,
                          json={"model": "mock", **body})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param, response.text
    if response.json()["error"]["code"] in ("too_many_messages", "text_too_long"):   # says the limit is the batch's
        assert "together" in response.json()["error"]["message"], response.text
