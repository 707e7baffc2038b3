"""Reliability at the edge, through the real launcher, tritonserver and frontend with real clients:
invalid text, size limits, unsupported fields, client aborts (499), overload (429 + Retry-After,
queued streams), the frontend's latency histograms. Framework behaviour runs on the mock pipelines;
the overload test runs the real voice pipeline."""
from __future__ import annotations

import asyncio
import io
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile
import websockets.sync.client
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import wait_for

pytestmark = pytest.mark.integration
JSON = {"content-type": "application/json"}
ENVELOPE = {"message", "type", "param", "code"}


def _frontend_metric(server, name: str, **labels) -> float:
    """Sum of the frontend's samples `name` whose labels include `labels` (0 when absent)."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", b'{"model":"mock","messages":[{"role":"user","content":"\\ud800 hi"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", b'{"model":"mock","messages":[{"role":"user","content":[{"type":"text","text":"a\\udfff"}]}]}',
     "messages[0].content[0].text"),
    ("/v1/chat/completions", b'{"model":"\\ud800","messages":[{"role":"user","content":"hi"}]}', "model"),
    ("/v1/chat/completions", b'{"model":"mock","stop":["x\\ud800"],"messages":[{"role":"user","content":"hi"}]}',
     "stop[0]"),
    ("/v1/chat/completions", b'{"model":"mock","messages":[{"role":"user","content":"hi"}],"ext":{"\\udc00":1}}',
     "ext.'\\udc00'"),
    ("/v1/audio/speech", b'{"model":"mock-speech","input":"hello \\udc00 world","voice":"alloy"}', "input"),
    ("/v1/audio/speech", b'{"model":"mock-speech","input":"hello","voice":"\\ud83d"}', "voice"),
])
def test_invalid_unicode_anywhere_is_a_400_and_keep_alive_survives(mock_server, path, body, param):
    with httpx.Client(base_url=mock_server.base_url, timeout=30) as client:
        for _ in range(2):   # the same connection keeps working after the error
            response = client.post(path, content=body, headers=JSON)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert set(error) == ENVELOPE and error["code"] == "invalid_unicode" and error["param"] == param
        assert client.get("/v1/models").status_code == 200


def test_size_limits_answer_before_any_model_work(mock_server):
    """Body bytes (413, unparsed), characters, messages: each refused in the envelope; the server
    then serves the next request on the same connection."""
    before = _frontend_metric(mock_server, "omni_frontend_e2e_seconds_count", pipeline="mock")
    with httpx.Client(base_url=mock_server.base_url, timeout=60) as client:
        huge = b'{"model": "mock", "messages": [{"role": "user", "content": "' + b"a " * (17 * 1024 * 1024) + b'"}]}'
        too_big = client.post("/v1/chat/completions", content=huge, headers=JSON)
        assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
        assert too_big.headers["connection"] == "close"
        for body, param, code in [
            ({"messages": [{"role": "user", "content": "a " * 70_000}]}, "messages[0].content", "text_too_long"),
            ({"messages": [{"role": "user", "content": "hi"}] * 513}, "messages", "too_many_messages"),
            ({"messages": [{"role": "user", "content": "hi"}], "stop": ["s"] * 17}, "stop", None),
        ]:
            response = client.post("/v1/chat/completions", json={"model": "mock", **body})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
            assert response.json()["error"]["code"] == code
        ok = client.post("/v1/chat/completions", json={"model": "mock", "messages": [{"role": "user", "content": "x"}]})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "tok0tok1tok2"
    assert _frontend_metric(mock_server, "omni_frontend_e2e_seconds_count", pipeline="mock") == before + 1


def test_client_text_echoed_in_errors_is_bounded_on_every_route_and_the_speech_websocket(mock_server):
    """Thirteenth outside test: a model name of 1 MB came back whole in the 404's message (1 000 156 bytes; also a
    content part type, an unknown field's name in the message and as `param`, a speech WebSocket's model). An error message is at most
    2048 characters and its param 256; the start of the value and the message's own end (the served models) stay."""
    huge = "A" * 1_000_000
    with httpx.Client(base_url=mock_server.base_url, timeout=60) as client:
        for path, body, status, param in [
            ("/v1/chat/completions", {"model": huge, "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
            ("/v1/responses", {"model": huge, "input": "hi"}, 404, "model"),
            ("/v1/audio/speech/batch", {"model": huge, "items": [{"input": "hi"}]}, 404, "model"),
            ("/v1/responses", {"model": "mock", "input": [{"role": "user", "content": [{"type": huge}]}]}, 400,
             "input[0].content[0]"),
            ("/v1/chat/completions", {"model": "mock", "messages": [{"role": "user", "content": "hi"}],
                                      "audio": {"voice": "alloy", "format": "wav", huge: 1}}, 400, None),
        ]:
            refused = client.post(path, json=body)
            assert refused.status_code == status and len(refused.content) < 4096, (path, refused.text[:300])
            error = refused.json()["error"]
            assert len(error["message"]) <= 2048 and error["message"].count("A") < 2048, path
            assert param is None and len(error["param"]) <= 256 and error["param"].startswith("audio.AAA") \
                or error["param"] == param, (path, error["param"][:300])
            assert status != 404 or error["message"].startswith("model 'AAA") and "' is not loaded; " in error["message"]
    url = mock_server.base_url.replace("http", "ws") + "/v1/audio/speech/stream"
    with websockets.sync.client.connect(url, max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "model": "m" * 100_000}))
        error = json.loads(ws.recv(timeout=30))
    assert error["code"] == "model_not_found" and error["param"] == "model" and len(error["message"]) <= 2048
    assert error["message"].startswith("model 'mmm") and error["message"].endswith("speech models: mock-speech")
    assert httpx.post(f"{mock_server.base_url}/v1/chat/completions", timeout=30, json={
        "model": "mock", "messages": [{"role": "user", "content": "x"}]}).json()["choices"][0]["message"]["content"] \
        == "tok0tok1tok2"


def test_a_client_cannot_forge_access_log_lines_nor_impose_odd_request_ids(mock_server):
    """Thirteenth outside test: the access log wrote the percent-decoded path as it was, so `GET /v1/models%0a<line>`
    (no API key needed) added a line of the client's making to the log, e.g. a forged `POST .../sleep -> 200`; and
    any x-request-id was taken (60 000 characters, blanks, tabs, Latin-1 letters: echoed in the header, logged, sent to
    Triton, part of `chatcmpl-` ids). The path is logged with its control characters escaped, and an x-request-id
    that is not 1-128 visible ASCII characters is replaced by a fresh one."""
    forged = "2026-01-01 00:00:00,000 INFO omni_frontend: POST /v1/admin/pipelines/mock/sleep -> 200 1.0 ms forged-13"
    with socket.create_connection(("127.0.0.1", mock_server.port), timeout=30) as raw:
        raw.sendall(f"GET /v1/models%0a{forged.replace(' ', '%20')} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                    .encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 404")
    wait_for(lambda: "forged-13" in mock_server.log(), timeout_s=10)
    assert not any(line.startswith(forged) for line in mock_server.log().splitlines())
    assert f"GET /v1/models\\n{forged} -> 404" in mock_server.log()

    body = {"model": "mock", "messages": [{"role": "user", "content": "x"}]}
    for sent, honoured in [("client-id_1.2:3", True), ("r" * 128, True), ("r" * 129, False), ("a b", False),
                           ("id\tx", False), ("caf\xe9", False)]:
        answer = httpx.post(f"{mock_server.base_url}/v1/chat/completions", json=body, timeout=30,
                            headers={"x-request-id": sent.encode("latin-1")})
        assert answer.status_code == 200 and (answer.headers["x-request-id"] == sent) == honoured, sent
        assert honoured or len(answer.headers["x-request-id"]) == 32   # a fresh uuid4 hex
        assert answer.json()["id"] == f"chatcmpl-{answer.headers['x-request-id']}"


@pytest.mark.parametrize("kwargs, param", [
    ({"tools": [{"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}],
      "tool_choice": "required"}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True, "top_logprobs": 3}, "logprobs"),
    ({"n": 2}, "n"),
    ({"audio": {"voice": "", "format": "wav"}, "modalities": ["text", "audio"]}, "audio.voice"),
    # twelfth outside test: refused by OpenAI and vLLM when not streamed (was a 200 that dropped it)
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    # twelfth outside test: a value no member of a union takes named the member (`stop.str`), no field of the request
    ({"stop": 5}, "stop"),
    ({"stop": [1]}, "stop"),
])
def test_unsupported_or_invalid_chat_fields_are_rejected_not_dropped(mock_server, kwargs, param):
    client = openai.OpenAI(base_url=f"{mock_server.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="mock", messages=[{"role": "user", "content": "hi"}], **kwargs)
    assert info.value.body["param"] == param


def _wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, samples, 16000, format="WAV", subtype="FLOAT")
    return buf.getvalue()


@pytest.mark.parametrize("form, param", [({"include[]": "logprobs"}, "include"),
                                         ({"known_speaker_names[]": "agent"}, "known_speaker_names"),
                                         ({"chunking_strategy": '{"type": "server_vad"}'}, "chunking_strategy"),
                                         ({"language": "english!"}, "language"),
                                         ({"prompt": "word " * 26215}, "prompt"),   # over --max-text-chars
                                         ({"file": np.full(1600, np.nan, np.float32)}, "file"),
                                         ({"file": np.full(160, 0.5, np.float32)}, "file"),   # < 0.1 s
                                         ({"stream": "true", "response_format": "srt"}, "response_format"),
                                         ({"stream": "true"}, "stream")])   # mock-asr has no streaming model
def test_bad_or_unsupported_transcription_fields_are_rejected(mock_server, form, param):
    audio = _wav(form.pop("file", np.zeros(1600, np.float32)))
    response = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30,
                          files={"file": ("a.wav", audio, "audio/wav")}, data={"model": "mock-asr", **form})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    ok = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30, data={"model": "mock-asr"},
                    files={"file": ("a.wav", _wav(np.zeros(1600, np.float32)), "audio/wav")})
    assert ok.status_code == 200 and ok.json()["text"] == "1600 samples"


def test_a_second_file_part_is_a_400_and_the_server_keeps_transcribing(mock_server):
    """One of two `file` parts used to be dropped silently and the other transcribed."""
    response = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30, data={"model": "mock-asr"},
                          files=[("file", ("a.wav", _wav(np.zeros(1600, np.float32)), "audio/wav")),
                                 ("file", ("b.wav", _wav(np.zeros(3200, np.float32)), "audio/wav"))])
    error = response.json()["error"]
    assert response.status_code == 400 and (error["param"], error["code"]) == ("file", "too_many_files"), error
    ok = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30, data={"model": "mock-asr"},
                    files={"file": ("b.wav", _wav(np.zeros(3200, np.float32)), "audio/wav")})
    assert ok.status_code == 200 and ok.json()["text"] == "3200 samples"


def test_a_batch_of_transcriptions_runs_two_at_a_time_and_each_gets_its_own_answer(mock_server):
    """mock_asr (a BatchStageModel with row_workers 2 and a ragged AUDIO input, like voice_asr) under 5
    concurrent requests of different lengths: while the first sleeps the others queue into one batch, whose rows
    run two at a time; each answer names its own sample count and the failing one alone gets its 400."""
    def post(samples: int, prompt: str) -> httpx.Response:
        return httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30,
                          files={"file": ("a.wav", _wav(np.zeros(samples, np.float32)), "audio/wav")},
                          data={"model": "mock-asr", "prompt": prompt})

    jobs = [(1600 * (i + 1), "sleep 0.4") for i in range(4)] + [(1600, "fail")]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: post(*job), jobs))
    texts = [answer.json()["text"] for answer in answers[:4]]
    assert [text.split()[0] for text in texts] == ["1600", "3200", "4800", "6400"], texts
    assert any(text.endswith("concurrently") for text in texts), texts
    assert answers[4].status_code == 400 and answers[4].json()["error"]["param"] == "prompt"


def test_a_short_transcription_batched_with_a_long_one_is_answered_when_its_own_row_is_done(mock_server):
    """Head of line: while a first request occupies mock_asr (1.5 s: long enough for both to queue on a loaded
    machine), a long (2.5 s) and a short (0 s) one queue into the same batch; the short one's answer goes out as
    soon as its own row is done (through its response sender), not when the long row ends (it used to wait for the
    whole batch: both answered together)."""
    def post(samples: int, prompt: str) -> tuple[str, float]:
        started = time.monotonic()
        answer = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30,
                            files={"file": ("a.wav", _wav(np.zeros(samples, np.float32)), "audio/wav")},
                            data={"model": "mock-asr", "prompt": prompt})
        return answer.json()["text"], time.monotonic() - started

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, 1600, "sleep 1.5")
        time.sleep(0.3)
        long, short = pool.submit(post, 3200, "sleep 2.5"), pool.submit(post, 4800, "sleep 0")
        (first_text, _), (long_text, long_s), (short_text, short_s) = first.result(), long.result(), short.result()
    assert (first_text, long_text.split()[0], short_text) == ("1600 samples", "3200", "4800 samples concurrently")
    assert long_s >= 2.5 and short_s <= long_s - 2.0, (long_s, short_s)


def test_batches_served_two_rows_at_a_time_survive_abandoned_requests(mock_server):
    """Rounds of 8 concurrent transcriptions (within the admission limits), every other one abandoned by its
    client after 0.15 s while mock_asr serves them two rows at a time: the others get their own answers, and
    the server still serves (a Triton call from a row worker thread used to crash tritonserver)."""
    def post(index: int) -> str:
        try:
            answer = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=0.15 if index % 2 else 30,
                                files={"file": ("a.wav", _wav(np.zeros(1600 + index, np.float32)), "audio/wav")},
                                data={"model": "mock-asr", "prompt": "sleep 0.2"})
        except httpx.TimeoutException:
            return "abandoned"
        return answer.json().get("text") or answer.text

    for _ in range(4):
        with ThreadPoolExecutor(8) as pool:
            heard = list(pool.map(post, range(8)))
        assert all(heard[i].startswith(f"{1600 + i} samples") for i in range(0, 8, 2)), heard
    ok = httpx.post(f"{mock_server.base_url}/v1/audio/transcriptions", timeout=30, data={"model": "mock-asr"},
                    files={"file": ("a.wav", _wav(np.zeros(1600, np.float32)), "audio/wav")})
    assert ok.json()["text"] == "1600 samples"


def test_speech_instructions_are_rejected_and_voices_of_a_voiceless_pipeline_are_404(mock_server):
    response = httpx.post(f"{mock_server.base_url}/v1/audio/speech", timeout=30, json={
        "model": "mock-speech", "input": "hello", "voice": "alloy", "instructions": "whisper it"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "instructions"
    missing = httpx.get(f"{mock_server.base_url}/v1/audio/voices", params={"model": "mock"}, timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_client_that_leaves_is_499_not_a_server_error(mock_server):
    """Non-streamed and streamed requests abandoned by their clients: counted and logged as 499,
    no traceback, the model is cancelled."""
    def status_counts() -> dict[str, float]:
        text = httpx.get(f"{mock_server.base_url}/metrics").text
        return {s.labels["status"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "omni_frontend_requests_total" and s.labels["route"] == "/v1/chat/completions"}

    before = status_counts()
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "repeat": 1000, "delay_ms": 20}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{mock_server.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    with httpx.stream("POST", f"{mock_server.base_url}/v1/chat/completions", json={**body, "stream": True},
                      timeout=30) as response:
        next(line for line in response.iter_lines() if "tok1" in line)   # leave mid-stream
    assert wait_for(lambda: status_counts().get("499", 0) - before.get("499", 0) == 2, 5.0), status_counts()
    after = status_counts()
    assert all(after.get(s, 0) == before.get(s, 0) for s in after if s.startswith("5"))
    assert " -> 499 " in mock_server.log() and "Traceback" not in mock_server.log()


def test_queued_streams_answer_as_idle_ones_and_the_rest_get_429(mock_server):
    """12 concurrent streams on a pipeline with 4 slots and 4 queue places: 4 stream at once, 3 queued ones
    stream once a slot comes free, 4 are refused with 429 + Retry-After in the envelope, and a queued stream the
    pipeline rejects gets the 400 it gets on an idle pipeline (it was a 200 whose stream ended in an error
    event: the fifth outside test); the admission gauges return to 0."""
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "repeat": 10, "delay_ms": 100}

    async def one(client: httpx.AsyncClient, i: int, delay_s: float):
        await asyncio.sleep(delay_s)
        sent = {**body, "reject": True} if i == 11 else body
        async with client.stream("POST", "/v1/chat/completions", json=sent) as response:
            if response.status_code != 200:
                return response.status_code, response.headers.get("retry-after"), json.loads(await response.aread()), None
            head_at = time.monotonic()
            lines = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
            return 200, head_at, lines, time.monotonic()

    async def run():
        async with httpx.AsyncClient(base_url=mock_server.base_url, timeout=60,
                                     limits=httpx.Limits(max_connections=20)) as client:
            # 7 take the 4 slots and 3 queue places, the rejected one (11) the last place, then 4 are refused
            return await asyncio.gather(*(one(client, i, 0.0 if i < 7 else 0.2 if i == 11 else 0.4)
                                          for i in range(12)))

    results = asyncio.run(run())
    refused = [r for r in results if r[0] == 429]
    served = [r for r in results if r[0] == 200]
    assert len(refused) == 4 and len(served) == 7 and results[11][0] == 400, [r[0] for r in results]
    assert results[11][2]["error"]["code"] == "mock" and results[11][2]["error"]["param"] == "reject"
    for _, retry_after, body_json, _ in refused:
        assert int(retry_after) >= 1 and body_json["error"]["code"] == "pipeline_overloaded"
        assert set(body_json["error"]) == ENVELOPE and body_json["error"]["type"] == "rate_limit_error"
    for _, _, lines, _ in served:
        assert lines[-1] == "[DONE]" and "".join(
            json.loads(line)["choices"][0]["delta"].get("content") or "" for line in lines[:-1]) == "".join(
            f"tok{i}" for i in range(10))
    # the queued streams got their head only once a running stream had finished
    first_done = min(done for *_, done in served)
    assert sum(head_at > first_done - 0.5 for _, head_at, _, _ in served) == 3   # the running ones: ~1 s before
    assert wait_for(lambda: _frontend_metric(mock_server, "omni_frontend_inflight_requests", pipeline="mock") == 0
                    and _frontend_metric(mock_server, "omni_frontend_queued_requests", pipeline="mock") == 0, 5)
    assert _frontend_metric(mock_server, "omni_frontend_queue_wait_seconds_count", pipeline="mock") >= 4
