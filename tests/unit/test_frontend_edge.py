"""The frontend's edge machinery without Triton: admission gates, the catch-all 500 and the body
limit, served by a real uvicorn over real sockets (keep-alive behaviour is the point); requests the
routes refuse before any pipeline work, through the in-process ASGI client."""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import fastapi
import grpc
import httpx
import numpy as np
import pytest
import soundfile as sf
import uvicorn
from tritonclient.utils import InferenceServerException
import websockets.sync.client
from fastapi.testclient import TestClient
from PIL import Image

from omni_frontend.admission import Gate
from omni_frontend.app import create_app
from omni_frontend.config import AdmissionLimits, FrontendConfig, RequestLimits
from omni_frontend.errors import APIError
from omni_frontend.observability import FrontendMetrics
from omni_frontend.pipelines import REGISTRY, parse_extra
from omni_frontend.tritonserver import TritonServer, free_port
from tests.harness import wait_for

pytestmark = pytest.mark.unit


class _Client:
    """The part of a starlette Request that Ticket.wait reads: whether the HTTP client has gone."""

    def __init__(self, gone: bool = False):
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


def test_gate_runs_queues_then_refuses_with_retry_after():
    async def scenario():
        metrics = FrontendMetrics()
        gate = Gate("p", max_inflight=2, max_queue=1, metrics=metrics)
        a, b = gate.enter(), gate.enter()
        queued = gate.enter()
        assert gate.running == 2 and len(gate.waiting) == 1   # two run, the third queues
        with pytest.raises(APIError) as info:
            gate.enter()
        assert info.value.status == 429 and info.value.headers == {"retry-after": "1"}
        assert info.value.code == "pipeline_overloaded"
        waiter = asyncio.ensure_future(queued.wait(_Client()))
        await asyncio.sleep(0)
        assert not waiter.done()
        a.release()
        a.release()   # idempotent
        await asyncio.wait_for(waiter, 1)
        assert gate.running == 2 and not gate.waiting   # the slot passed to the waiter
        assert metrics.queued.labels("p")._value.get() == 0 and metrics.inflight.labels("p")._value.get() == 2
        b.release()
        queued.release()
        assert gate.running == 0 and metrics.rejected.labels("p")._value.get() == 1
        assert gate.mean_run_s is not None

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_up_its_place_and_slots_never_leak():
    async def scenario():
        gate = Gate("p", max_inflight=1, max_queue=2)
        running, first, second = gate.enter(), gate.enter(), gate.enter()
        first_wait = asyncio.ensure_future(first.wait(_Client()))
        second_wait = asyncio.ensure_future(second.wait(_Client()))
        await asyncio.sleep(0)
        first_wait.cancel()          # the client of the first queued request left
        first.release()
        running.release()            # the slot skips the cancelled waiter
        await asyncio.wait_for(second_wait, 1)
        assert gate.running == 1 and not gate.waiting
        # a waiter that was handed the slot but released before it resumed frees the slot
        third = gate.enter()
        second.release()
        third.release()
        assert gate.running == 0 and not gate.waiting
        never_waited = gate.enter()
        never_waited.release()
        assert gate.running == 0

    asyncio.run(scenario())


def test_a_queued_request_whose_client_left_never_uses_its_slot():
    """Admitted from the queue after its client left: 499 at once, and the slot passes on (the request
    is never sent to Triton, where a cancel right after the send could be missed)."""
    async def scenario():
        gate = Gate("p", max_inflight=1, max_queue=2)
        running, gone, alive = gate.enter(), gate.enter(), gate.enter()
        gone_wait = asyncio.ensure_future(gone.wait(_Client(gone=True)))
        alive_wait = asyncio.ensure_future(alive.wait(_Client()))
        await asyncio.sleep(0)
        running.release()
        with pytest.raises(APIError) as info:
            await asyncio.wait_for(gone_wait, 1)
        assert (info.value.status, info.value.code) == (499, "client_closed_request")
        gone.release()               # what AdmissionMiddleware does when the route raised
        await asyncio.wait_for(alive_wait, 1)
        assert gate.running == 1 and not gate.waiting
        alive.release()
        assert gate.running == 0

    asyncio.run(scenario())


def test_queue_wait_is_bounded_and_a_long_expected_wait_is_refused_at_once():
    async def scenario():
        gate = Gate("p", max_inflight=1, max_queue=4, max_wait_s=0.2)
        running, queued = gate.enter(), gate.enter()
        with pytest.raises(APIError) as info:
            await queued.wait(_Client())  # nobody frees the slot within 0.2 s
        assert (info.value.status, info.value.code) == (429, "queue_timeout") and "retry-after" in info.value.headers
        queued.release()
        assert not gate.waiting
        gate.mean_run_s = 10.0           # recent requests took 10 s: a queued one would wait ~10 s > 0.2 s
        with pytest.raises(APIError) as info:
            gate.enter()
        assert info.value.code == "pipeline_overloaded" and info.value.headers == {"retry-after": "10"}
        running.release()
        assert gate.running == 0

    asyncio.run(scenario())


def test_a_request_admitted_after_its_pipeline_fell_asleep_gets_503_pipeline_sleeping():
    """A request queued for a slot (or still being validated) while its pipeline was put to sleep was sent to
    Triton once admitted, where the pipeline's models were unloaded: a 500 "Request for unknown model" instead of
    the 503 `pipeline_sleeping` every other request of a sleeping pipeline gets."""
    from types import SimpleNamespace

    from omni_frontend import admission

    async def scenario():
        app = create_app(FrontendConfig(triton_url="127.0.0.1:1", pipelines=[REGISTRY["asr"]],
                                        admission=AdmissionLimits(max_inflight=1, max_queue=2)))
        asr = REGISTRY["asr"]

        def request():
            return SimpleNamespace(app=app, scope={}, is_disconnected=_Client().is_disconnected)

        running = admission.enter(request(), asr)
        queued = admission.enter(request(), asr)      # the one slot is taken: it queues
        waiting = asyncio.ensure_future(queued.wait(request()))
        await asyncio.sleep(0)
        app.state.control.sleeping.add("asr")         # POST /v1/admin/pipelines/asr/sleep
        running.release()                             # a slot comes free: the queued request is admitted ...
        with pytest.raises(APIError) as info:
            await asyncio.wait_for(waiting, 1)
        assert (info.value.status, info.value.code) == (503, "pipeline_sleeping")   # ... but not sent to Triton
        queued.release()
        with pytest.raises(APIError) as info:         # validated while awake, admitted once asleep
            admission.enter(request(), asr)
        assert (info.value.status, info.value.code) == (503, "pipeline_sleeping")
        gate = app.state.admission.gate("asr")
        assert gate.running == 0 and not gate.waiting

    asyncio.run(scenario())


@contextlib.contextmanager
def _served(app, **config):
    """A real uvicorn serving `app` on a free port in a thread (`config`: more uvicorn.Config arguments); yields
    its http://127.0.0.1:PORT."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("kind", ["sse", "raw"])
def test_a_client_that_stops_reading_a_stream_gives_its_slot_back_after_the_send_timeout(kind):
    """A streamed response whose client stops reading (its socket stays open, its receive window full) held the
    request's admission slot, and its pipeline request, for as long as the client liked: four such clients made a
    pipeline answer 429 to everyone. A part of a stream that the client does not take within
    `RequestLimits.send_timeout_s` now ends the response: the stream is closed, the slot freed, the request
    counted as 499. Raw streams (speech `pcm`) also close their generator, as SSE ones do."""
    import socket

    from sse_starlette.sse import EventSourceResponse

    from omni_frontend import admission
    from omni_frontend.pipeline_stream import ClosingStreamingResponse

    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", recover_stages=False, pipelines=[REGISTRY["tts"]],
                                    limits=RequestLimits(send_timeout_s=1.0)))
    closed = threading.Event()

    async def endless():
        try:
            while True:
                yield "x" * 65536
                await asyncio.sleep(0)
        finally:
            closed.set()

    @app.get("/test/stream")
    async def stream(request: fastapi.Request):
        await admission.enter(request, REGISTRY["tts"]).wait(request)
        return EventSourceResponse(endless()) if kind == "sse" else ClosingStreamingResponse(endless())

    gate = app.state.admission.gate("tts")
    with _served(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"GET /test/stream HTTP/1.1\r\nHost: x\r\n\r\n")   # ... and never reads
            assert wait_for(lambda: gate.running == 1, 10)
            assert wait_for(lambda: closed.is_set() and gate.running == 0, 10), "the slot is still held"
    counted = app.state.metrics.requests.labels("/test/stream", "GET", "499")._value.get()
    assert counted == 1


async def _echo_app(scope, receive, send):
    """An ASGI app answering each HTTP request with its body."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def _reply(sock, ending: bytes) -> bytes:
    data = b""
    while not data.endswith(ending):
        data += sock.recv(4096) or b"<closed>"
        assert not data.endswith(b"<closed>"), data
    return data


def _closed_within(sock, seconds: float) -> bool:
    import socket

    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except socket.timeout:
        return False
    except ConnectionError:
        return True


def test_a_connection_that_does_not_send_its_request_head_in_time_is_closed():
    """Silent connections and trickled request heads (slowloris) were held for good (each a socket and a file
    descriptor; ~20k of them make the frontend refuse everyone). With the launcher's protocol
    (omni_frontend.http_protocol) a head must arrive within the timeout of the connection opening or of the
    request's first byte: silent, partial-head and kept-alive-then-partial connections are closed; a whole request
    sent slowly but in time, and a long body after its head, are served."""
    import socket

    from omni_frontend.http_protocol import with_head_timeout

    with _served(_echo_app, http=with_head_timeout(0.5), timeout_keep_alive=30) as url:
        port = int(url.rsplit(":", 1)[1])
        silent, partial, kept = (socket.create_connection(("127.0.0.1", port)) for _ in range(3))
        partial.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        kept.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
        assert _reply(kept, b"ok").startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET / HTTP/1.1\r\n")   # the next request on the kept-alive connection, never finished
        assert all(_closed_within(sock, 3) for sock in (silent, partial, kept))
        with socket.create_connection(("127.0.0.1", port)) as slow:
            for piece in (b"POST / HTTP/1.1\r\n", b"Host: x\r\n", b"Content-Length: 4\r\n\r\n"):
                slow.sendall(piece)
                time.sleep(0.1)
            time.sleep(1.0)   # the body may take longer than the head's deadline
            slow.sendall(b"body")
            assert _reply(slow, b"body").startswith(b"HTTP/1.1 200")
    with pytest.raises(ValueError):
        with_head_timeout(0)


def test_a_request_body_that_stalls_is_closed_and_a_slow_one_is_served():
    """A connection that sent its head and part of its body, then nothing, was held for good (the head deadline ends
    with the head; a socket and a file descriptor each, as the slowloris heads were). Now a body may not pause for
    longer than the body timeout (nginx's client_body_timeout), while a body that keeps coming, however slowly, and a
    kept-alive connection idle between requests are served as before."""
    import socket

    from omni_frontend.http_protocol import with_head_timeout

    with _served(_echo_app, http=with_head_timeout(30, body_idle_timeout_s=0.5), timeout_keep_alive=30) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            assert _closed_within(stalled, 3)
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n")
            for piece in (b"ab", b"cd", b"ef", b"gh"):   # 1.2 s in all, no pause of 0.5 s
                time.sleep(0.3)
                slow.sendall(piece)
            assert _reply(slow, b"abcdefgh").startswith(b"HTTP/1.1 200")
            time.sleep(1.0)   # idle between requests: the keep-alive timeout's business
            slow.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok")
            assert _reply(slow, b"ok").startswith(b"HTTP/1.1 200")
    with pytest.raises(ValueError):
        with_head_timeout(30, body_idle_timeout_s=0)


@pytest.fixture(scope="module")
def edge_app_url():
    """A real uvicorn serving the app (no Triton needed for these routes) plus a route with a bug."""
    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", pipelines=[], limits=RequestLimits(max_body_bytes=1000)))

    @app.get("/test-bug")
    async def _bug():
        raise RuntimeError("a bug")

    with _served(app) as url:
        yield url


def test_unhandled_error_is_a_500_envelope_that_closes_the_connection_cleanly(edge_app_url, caplog):
    with caplog.at_level(logging.ERROR, logger="omni_frontend"), httpx.Client(base_url=edge_app_url) as client:
        for _ in range(3):
            failed = client.get("/test-bug")
            assert failed.status_code == 500 and failed.headers["connection"] == "close"
            assert failed.json()["error"]["code"] == "internal_error" and "a bug" in failed.json()["error"]["message"]
            assert client.get("/v1/models").status_code == 200   # the next request is not reset
    assert sum("unhandled error in GET /test-bug" in r.getMessage() for r in caplog.records) == 3


def test_body_limit_gives_413_envelope_for_declared_and_chunked_bodies(edge_app_url):
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * 5000 + b'"}]}'
    with httpx.Client(base_url=edge_app_url) as client:
        declared = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        chunked = client.post("/v1/chat/completions", content=iter([big[:600], big[600:]]),
                              headers={"content-type": "application/json"})
        for response in (declared, chunked):
            assert response.status_code == 413 and response.headers["connection"] == "close"
            assert response.json()["error"]["code"] == "request_too_large"
            assert "1000 byte limit" in response.json()["error"]["message"]
        assert client.get("/v1/models").status_code == 200


def test_a_sleeping_pipeline_is_503_on_voices_and_refused_by_realtime():
    """Its models are unloaded: naming it used to reach Triton ('unknown model' -> 500, or a realtime
    session whose every response failed with a server error)."""
    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", pipelines=[REGISTRY["voice"]]))
    app.state.control.sleeping.add("voice")
    with _served(app) as url:
        named = httpx.get(f"{url}/v1/audio/voices?model=voice", timeout=10)
        assert named.status_code == 503 and named.json()["error"]["code"] == "pipeline_sleeping", named.text
        listed = httpx.get(f"{url}/v1/audio/voices", timeout=10)
        assert listed.status_code == 200 and listed.json()["voices"] == [], listed.text
        with websockets.sync.client.connect(url.replace("http", "ws") + "/v1/realtime?model=voice") as ws:
            assert json.loads(ws.recv(timeout=10))["error"]["code"] == "pipeline_sleeping"
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 1013


def test_an_image_request_without_model_to_a_sleeping_image_pipeline_is_503_pipeline_sleeping():
    """Without `model` the image routes pick the first image pipeline of the task, and did so also when it slept:
    its extension fields were then checked against the unloaded model (a 5xx from Triton) instead of the request
    getting the 503 `pipeline_sleeping` that naming the pipeline gets."""
    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", recover_stages=False, pipelines=[REGISTRY["qwen_image"]]))
    app.state.control.sleeping.add("qwen_image")
    with TestClient(app) as client:
        for body in ({"prompt": "a cube", "style": "vivid"}, {"prompt": "a cube"}):
            reply = client.post("/v1/images/generations", json=body)
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "pipeline_sleeping", reply.text


@pytest.mark.parametrize("path, body", [
    ("/v1/audio/speech", {"model": "tts", "input": "Hello.", "voice": "alloy", "response_format": "pcm",
                          "stream_format": "sse"}),
    ("/v1/chat/completions", {"model": "voice", "stream": True, "messages": [{"role": "user", "content": "hi"}]}),
])
def test_a_queued_stream_whose_slot_does_not_come_gets_a_429_status(path, body):
    """A streamed request that has to queue gets its head only with its slot: when the slot does not come free
    within --max-queue-wait it is a 429 `queue_timeout` with Retry-After, as a non-streamed one (it was a 200
    whose stream held only the error event; before that, for speech, a NameError)."""
    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", pipelines=[REGISTRY["tts"], REGISTRY["voice"]],
                                    admission=AdmissionLimits(max_inflight=1, max_queue=1, max_queue_wait_s=0.3)))
    app.state.admission.gate(body["model"]).running = 1   # the one slot is taken: the next request queues
    with _served(app) as url:
        reply = httpx.post(f"{url}{path}", timeout=10, json=body)
    assert reply.status_code == 429 and int(reply.headers["retry-after"]) >= 1, reply.text
    assert reply.json()["error"]["code"] == "queue_timeout"
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_a_bad_request_is_a_400_also_when_its_pipeline_is_full():
    """Validation and input decoding come before admission: with every slot and queue place taken, a request
    that can never succeed is still its 400 (it was a 429 to retry, and the SDK retries a 429: the fifth outside
    test), while a good one gets the 429."""
    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", pipelines=[REGISTRY["voice"], REGISTRY["asr"]],
                                    admission=AdmissionLimits(max_inflight=1, max_queue=0)))
    for name in ("voice", "asr"):
        app.state.admission.gate(name).running = 1
    chat = {"model": "voice", "messages": [{"role": "user", "content": "hi"}]}
    not_audio = [{"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv", "format": "wav"}}]
    with _served(app) as url:
        assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=10).status_code == 429
        for bad, param in [({"logprobs": True}, "logprobs"),
                           ({"messages": [{"role": "user", "content": not_audio}]}, "messages[0].content[0]")]:
            reply = httpx.post(f"{url}/v1/chat/completions", json={**chat, **bad}, timeout=10)
            assert reply.status_code == 400 and reply.json()["error"]["param"].startswith(param), reply.text
        reply = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "asr"}, timeout=10,
                           files={"file": ("a.wav", b"not audio at all", "audio/wav")})
        assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_audio", reply.text


@pytest.fixture(scope="module")
def routes_client(tmp_path_factory):
    """The app of an asr + image edit + voice (realtime) + wan server whose Triton is unreachable, through the
    in-process ASGI client (startup and shutdown run): requests refused at the edge never need Triton;
    --max-text-chars is 100."""
    config = FrontendConfig(triton_url="127.0.0.1:1", recover_stages=False, limits=RequestLimits(max_text_chars=100),
                            pipelines=[REGISTRY[name] for name in ("asr", "qwen_image_edit", "voice", "wan")],
                            data_dir=tmp_path_factory.mktemp("data"))
    with TestClient(create_app(config)) as client:
        yield client


def test_every_model_id_a_route_takes_is_listed_and_retrieved_by_its_own_id(routes_client):
    """OpenAI's list names every id the API takes and retrieve answers the id asked for: an alias (`whisper-1`)
    was missing from the list and retrieved as its pipeline (`asr`; the fifth outside test)."""
    import openai

    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=routes_client)
    ids = [m.id for m in client.models.list().data]
    assert ids[:4] == ["asr", "qwen_image_edit", "voice", "wan"]
    assert set(ids[4:]) == {"whisper-1", "whisper-tiny.en", "gpt-4o-transcribe", "gpt-4o-mini-transcribe",
                            "sora-2", "sora-2-pro"}
    for alias, pipeline in (("whisper-1", "asr"), ("sora-2", "wan"), ("asr", "asr")):
        model = client.models.retrieve(alias)
        assert model.id == alias and model.object == "model" and model.model_extra["pipeline"] == pipeline
    missing = routes_client.get("/v1/models/tts-1")   # tts is not served
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def _error(response, status: int = 400) -> dict:
    """The OpenAI envelope's `error` of a refused request."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize("path, body, param", [
    ("/v1/videos", {"model": "wan", "prompt": "a cat", "style": "vivid"}, "style"),
    ("/v1/chat/completions", {"model": "voice", "messages": [{"role": "user", "content": "hi"}],
                              "audio": {"voice": "alloy", "format": "wav", "speed": 2}}, "audio.speed"),
])
def test_a_field_the_route_does_not_know_is_an_unsupported_parameter(routes_client, path, body, param):
    """Refused in the frontend with the same code as a field a pipeline does not read (it was `invalid_value`,
    "style: Extra inputs are not permitted", while images answered `unsupported_parameter`)."""
    error = _error(routes_client.post(path, json=body))
    assert (error["param"], error["code"]) == (param, "unsupported_parameter")
    assert error["message"] == f"{param} is not a request field of POST {path}"


@pytest.mark.parametrize("fmt", ["srt", "vtt", "verbose_json"])
def test_a_streamed_transcription_refuses_formats_its_events_cannot_carry(routes_client, fmt):
    """The SSE events carry text only, as OpenAI's: srt / vtt / verbose_json with stream=true are a 400 naming
    response_format before the audio is even decoded (they used to stream plain text events, the format
    ignored; the file here is not audio, so the old code answered about the file)."""
    error = _error(routes_client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio" * 50)},
                                      data={"model": "whisper-1", "stream": "true", "response_format": fmt}))
    assert (error["param"], error["code"]) == ("response_format", "unsupported_value") and fmt in error["message"]
    # not streamed, the format is served: the request goes on to decode the file
    assert _error(routes_client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio" * 50)},
                                     data={"model": "whisper-1", "response_format": fmt}))["param"] == "file"


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_streamed_transcription_takes_json_and_text(routes_client, fmt):
    error = _error(routes_client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio" * 50)},
                                      data={"model": "whisper-1", "stream": "true", "response_format": fmt}))
    assert (error["param"], error["code"]) == ("file", "invalid_audio")   # past the format check, at the decode


def test_streaming_a_pipeline_without_a_streaming_model_is_refused_before_the_audio_is_read(tmp_path):
    """An --extra-pipeline transcription model has no streamed twin: stream=true is a 400 naming `stream` at
    once (it used to be admitted and the audio decoded first; the file here is not audio, so the old code
    answered about the file)."""
    config = FrontendConfig(triton_url="127.0.0.1:1", recover_stages=False, data_dir=tmp_path,
                            pipelines=[parse_extra("plain_asr=transcription:voice_asr")])
    with TestClient(create_app(config)) as client:
        error = _error(client.post("/v1/audio/transcriptions", files={"file": ("a.wav", b"not audio" * 50)},
                                   data={"model": "plain_asr", "stream": "true"}))
    assert error["param"] == "stream" and "cannot stream" in error["message"]


def _wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(1600, np.float32), 16000, format="WAV")
    return buf.getvalue()


def _png(alpha: bool = False) -> bytes:
    buf = io.BytesIO()
    Image.new("RGBA" if alpha else "RGB", (32, 32)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("route, files, data, param", [
    ("/v1/audio/transcriptions", [("file", ("a.wav", _wav())), ("file", ("b.wav", _wav()))], {"model": "whisper-1"},
     "file"),
    ("/v1/images/edits", [("image", ("a.png", _png())), ("mask", ("m.png", _png(True))), ("mask", ("n.png", _png(True)))],
     {"model": "qwen_image_edit", "prompt": "blue"}, "mask"),
    ("/v1/videos", [("input_reference", ("a.png", _png())), ("input_reference", ("b.png", _png()))],
     {"model": "wan", "prompt": "a cat"}, "input_reference"),
])
def test_a_single_file_field_sent_twice_is_a_400(routes_client, route, files, data, param):
    """One of the two parts used to be dropped silently (the request then ran on the other)."""
    error = _error(routes_client.post(route, files=files, data=data))
    assert (error["param"], error["code"]) == (param, "too_many_files") and "exactly one file" in error["message"]


def test_an_edit_takes_several_images_and_one_mask(routes_client):
    """`image` / `image[]` is OpenAI's repeatable field: two images and one mask pass the edge (and reach
    the pipeline, here an unreachable Triton)."""
    response = routes_client.post("/v1/images/edits", data={"model": "qwen_image_edit", "prompt": "blue"}, files=[
        ("image[]", ("a.png", _png())), ("image[]", ("b.png", _png())), ("mask", ("m.png", _png(True)))])
    assert (response.status_code, response.json()["error"]["code"]) == (503, "triton_unavailable"), response.text


def test_realtime_instructions_over_max_text_chars_are_refused_by_the_event_that_sets_them(routes_client):
    """session.update / response.create instructions over --max-text-chars (100 here) get an `error` naming
    them at the event (they used to be accepted and refused by the LLM stage when a response ran); the
    session keeps its previous config and goes on."""
    with routes_client.websocket_connect("/v1/realtime?model=voice") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
        assert ws.receive_json()["session"]["instructions"] == "Be brief."
        for event, param in [({"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 101}},
                              "session.instructions"),
                             ({"type": "response.create", "response": {"instructions": "x" * 101}},
                              "response.instructions")]:
            ws.send_json({**event, "event_id": "evt_1"})
            error = ws.receive_json()
            assert error["type"] == "error", error
            assert (error["error"]["param"], error["error"]["event_id"]) == (param, "evt_1")
            assert "101 characters; the limit is 100" in error["error"]["message"]
            # nothing changed or started: the next update is answered, with the previous instructions
            ws.send_json({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
            updated = ws.receive_json()
            assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "Be brief.", updated
        ws.send_json({"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 100}})
        assert ws.receive_json()["session"]["instructions"] == "x" * 100   # the limit itself is accepted


def test_the_launchers_triton_client_reaches_a_server_soon_after_it_listens(tmp_path):
    """The launcher's client exists before tritonserver listens (its models load first). With gRPC's default
    reconnect backoff (1 s growing 1.6x) a channel refused for 6 s tried again ~3.4 s after the server came up
    (~25 s after a 48 s load); `control_client` retries within 0.5 s. The server here is a bare gRPC server
    (no Triton service: the call answers UNIMPLEMENTED once connected)."""
    port = free_port()
    client = TritonServer([tmp_path], [], grpc_port=port, http_port=0, metrics_port=0,
                          log_path=tmp_path / "log").control_client()

    def status() -> str:
        try:
            client.is_server_live()
        except InferenceServerException as exc:
            return str(exc.status())
        return "OK"

    refused_until = time.monotonic() + 6
    while time.monotonic() < refused_until:
        assert "UNAVAILABLE" in status()
        time.sleep(0.2)
    server = grpc.server(ThreadPoolExecutor(1))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        listening = time.monotonic()
        while "UNAVAILABLE" in status() and time.monotonic() - listening < 10:
            time.sleep(0.05)
        reached_after = time.monotonic() - listening
        assert "UNIMPLEMENTED" in status() and reached_after < 1.5, reached_after
    finally:
        server.stop(0)
        client.close()


USER_HI = [{"role": "user", "content": "hi"}]
# The fields the voice, tts and qwen_image pipelines answer {"action": "fields"} with (their REQUEST_FIELDS).
_PUBLISHED = {"voice": {"type": "fields", "fields": ["first_chunk_words", "max_tokens", "messages", "modalities", "voice"],
                        "hints": {}},
              "tts": {"type": "fields", "fields": ["input", "speed", "voice"], "hints": {}},
              "qwen_image": {"type": "fields", "hints": {"guidance_scale": "use true_cfg_scale"},
                             "fields": ["height", "n", "negative_prompt", "num_inference_steps", "partial_images",
                                        "prompt", "seed", "task", "true_cfg_scale", "width"]}}


@pytest.fixture(scope="module")
def full_client():
    """A voice + tts + qwen_image app whose every pipeline is full (one slot, taken) and whose Triton is
    unreachable; the pipelines' published fields are known (as after a first request)."""
    app = create_app(FrontendConfig(triton_url="127.0.0.1:1", recover_stages=False,
                                    pipelines=[REGISTRY[name] for name in ("voice", "tts", "qwen_image")],
                                    admission=AdmissionLimits(max_inflight=1, max_queue=4, max_queue_wait_s=0.3)))
    app.state.pipeline_fields = dict(_PUBLISHED)
    for name in ("voice", "tts", "qwen_image"):
        app.state.admission.gate(name).running = 1   # the one slot is taken: the next request queues
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", {"model": "voice", "stream": True, "min_tokens": 5, "messages": USER_HI}, "min_tokens"),
    ("/v1/chat/completions", {"model": "voice", "stream": True, "voice": "alloy", "messages": USER_HI}, "voice"),
    ("/v1/chat/completions", {"model": "voice", "min_tokens": 5, "messages": USER_HI}, "min_tokens"),
    ("/v1/audio/speech", {"model": "tts", "input": "hi", "voice": "alloy", "response_format": "pcm",
                          "stream_format": "sse", "speaker": "vivian"}, "speaker"),
    ("/v1/audio/speech", {"model": "tts", "input": "hi", "voice": "alloy", "speaker": "vivian"}, "speaker"),
    ("/v1/images/generations", {"model": "qwen_image", "prompt": "a cube", "stream": True, "style": "vivid"}, "style"),
    ("/v1/images/generations", {"model": "qwen_image", "prompt": "a cube", "width": 64}, "width"),
])
def test_a_field_the_pipeline_does_not_read_is_a_400_before_admission_whatever_the_load(full_client, path, body,
                                                                                      field):
    """A streamed request that had to queue got a 200 head, waited for a slot (or --max-queue-wait) holding a queue
    place, then an error event; the route now refuses it against the pipeline's published fields before admission.
    A key the route fills itself (chat's `voice`, an image's `width`) is refused too: it was overwritten."""
    started = time.monotonic()
    error = _error(full_client.post(path, json=body))
    assert time.monotonic() - started < 0.25   # not queued (--max-queue-wait 0.3 s)
    assert (error["param"], error["code"]) == (field, "unsupported_parameter")
    model = body["model"]
    assert error["message"].startswith(f"{field} is not a request field of POST {path} with model {model}")
    assert not full_client.app.state.admission.gate(model).waiting   # it took no queue place


def test_the_unread_field_message_lists_the_routes_fields_and_the_pipelines_extensions(full_client):
    chat = _error(full_client.post("/v1/chat/completions", json={"model": "voice", "messages": USER_HI, "x": 1}))
    assert "first_chunk_words" in chat["message"] and "max_completion_tokens" in chat["message"]
    image = _error(full_client.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "a",
                                                                     "guidance_scale": 7}))
    assert image["message"].startswith("guidance_scale is not a request field of POST /v1/images/generations with "
                                       "model qwen_image: use true_cfg_scale (its fields: ")
    listed = image["message"].split("(its fields: ")[1]
    assert "size" in listed and "num_inference_steps" in listed
    assert not {"task", "width", "height"} & set(listed.rstrip(")").split(", "))


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "voice", "stream": True, "first_chunk_words": 2, "min_tokens": None,
                              "messages": USER_HI}),
    ("/v1/audio/speech", {"model": "tts", "input": "hi", "voice": "alloy", "response_format": "pcm",
                          "stream_format": "sse", "speaker": None}),
    ("/v1/images/generations", {"model": "qwen_image", "prompt": "a", "moderation": "auto", "stream": True}),
])
def test_fields_the_pipeline_reads_and_null_ones_queue_as_before(full_client, path, body):
    """Past the field check the request queues: its queue wait (0.3 s) runs out, a 429 (or its SSE error event)."""
    response = full_client.post(path, json=body)
    assert "queue_timeout" in response.text, response.text


@pytest.mark.parametrize("value", ["low", {"mode": "block"}])
def test_image_moderation_other_than_auto_is_refused(full_client, value):
    error = _error(full_client.post("/v1/images/generations", json={"model": "qwen_image", "prompt": "a",
                                                                    "moderation": value}))
    assert (error["param"], error["code"]) == ("moderation", "unsupported_parameter")


@pytest.mark.parametrize("voice", [{"id": "alloy"}, {"id": "nobody"}])
def test_the_custom_voice_object_form_is_resolved_to_its_id(full_client, voice):
    """openai's SpeechCreateParams.voice / ChatCompletionAudioParam.voice may be {"id": ...} (realtime took it): the
    routes used to refuse it as a type error; now the id goes to the pipeline as the voice (past validation, the
    request queues here; the real pipeline's 400 for an unknown id is in tests/integration)."""
    speech = full_client.post("/v1/audio/speech", json={"model": "tts", "input": "hi", "voice": voice})
    chat = full_client.post("/v1/chat/completions", json={"model": "voice", "messages": USER_HI,
                                                          "audio": {"voice": voice, "format": "wav"}})
    for response in (speech, chat):
        assert response.status_code == 429 and response.json()["error"]["code"] == "queue_timeout", response.text


@pytest.mark.parametrize("voice", [{"id": ""}, {"id": 5}, {"name": "alloy"}, {}])
def test_a_malformed_voice_object_is_a_400_naming_voice(full_client, voice):
    error = _error(full_client.post("/v1/audio/speech", json={"model": "tts", "input": "hi", "voice": voice}))
    assert error["param"] == "voice"


_NOT_AUDIO = {"file": ("a.wav", b"not audio" * 50)}


@pytest.mark.parametrize("data, param", [
    ({"timestamp_granularity": "word", "response_format": "verbose_json"}, "timestamp_granularity"),   # a typo
    ({"temprature": "0.2"}, "temprature"),
    ({"foo[]": "x"}, "foo"),
    ({"chunking_strategy[type]": "server_vad", "chunking_strategy[silence_duration_ms]": "200"}, "chunking_strategy"),
    ({"chunking_strategy": '{"type": "server_vad"}'}, "chunking_strategy"),
    ({"include[]": "logprobs"}, "include"),
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities"),          # response_format json (default)
    *[({"timestamp_granularities[]": "segment", "response_format": fmt}, "timestamp_granularities")
      for fmt in ("json", "text", "srt", "vtt")],
])
def test_transcription_fields_it_does_not_read_are_a_400_naming_them(routes_client, data, param):
    """Unread multipart fields, chunking_strategy's object form and timestamp granularities without verbose_json
    (OpenAI: only with verbose_json) used to be ignored (200, without what the client asked for)."""
    error = _error(routes_client.post("/v1/audio/transcriptions", files=_NOT_AUDIO, data={"model": "asr", **data}))
    assert (error["param"], error["code"]) == (param, "unsupported_parameter"), error


def test_the_sdks_transcription_fields_pass_the_field_checks(routes_client):
    """What the openai SDK sends (lists as `name[]`, chunking_strategy "auto", stream false) reaches the audio decode."""
    import openai

    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=routes_client, max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.transcriptions.create(model="whisper-1", file=_NOT_AUDIO["file"], response_format="verbose_json",
                                           timestamp_granularities=["word", "segment"], chunking_strategy="auto",
                                           stream=False, language="en", prompt="p", temperature=0)
    assert info.value.body["param"] == "file"


def test_verbose_json_language_is_the_name_openai_gives():
    from omni_frontend.routes.transcriptions import language_name

    assert [language_name(c) for c in ("en", "de", "yue", "xx", None)] == ["english", "german", "cantonese", "xx", None]


def test_a_batch_runs_on_free_slots_feeds_per_item_run_times_and_frees_every_slot():
    """batching.run_items: the batch's own ticket plus free slots (at most CONCURRENCY); the gate's mean run time
    gets each item's time, not the tickets' hold times (a 32-item batch used to feed its whole duration: ordinary
    requests then got an immediate 429); a failing item cancels the rest and every slot comes back."""
    from omni_frontend import batching

    async def scenario():
        gate = Gate("p", max_inflight=3, max_queue=4)
        ticket = gate.enter()
        peak, order = [0], []

        async def item(i):
            peak[0] = max(peak[0], gate.running)
            await asyncio.sleep(0.05)
            order.append(i)
            return i * 10

        assert await batching.run_items(ticket, 7, item) == [0, 10, 20, 30, 40, 50, 60]
        assert peak[0] == 3 and gate.running == 1 and sorted(order) == list(range(7))   # two extra slots, given back
        assert 0.04 < gate.mean_run_s < 0.2, gate.mean_run_s    # ~0.05 s per item, not the batch's ~0.15 s
        ticket.release()
        assert gate.running == 0 and 0.04 < gate.mean_run_s < 0.2

        async def failing(i):
            await asyncio.sleep(0.01 * i)
            if i == 1:
                raise RuntimeError("item 1")
            await asyncio.sleep(5)

        ticket = gate.enter()
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(batching.run_items(ticket, 5, failing), 2)
        ticket.release()
        assert gate.running == 0 and not gate.waiting

    asyncio.run(scenario())


def test_a_batch_passes_its_own_slot_to_a_waiting_request_between_items_and_a_cancel_frees_it_once():
    """Twelfth outside test: a batch holding every slot made ordinary requests wait for all its items. Between two
    items the batch's own ticket passes its slot to a queued request and queues behind it (`Ticket.take_turn`); a
    batch cancelled while queued so holds nothing, and its release frees no slot a second time."""
    from omni_frontend import batching

    async def scenario():
        gate = Gate("p", max_inflight=1, max_queue=4)
        ticket = gate.enter()
        order = []

        async def item(i):
            await asyncio.sleep(0.05)
            order.append(i)
            return i

        async def ordinary():
            other = gate.enter()
            await other.wait()
            order.append("single")
            other.release()

        batch = asyncio.ensure_future(batching.run_items(ticket, 4, item))
        await asyncio.sleep(0.02)
        await ordinary()
        assert await batch == [0, 1, 2, 3] and order == [0, "single", 1, 2, 3], order
        ticket.release()
        assert gate.running == 0 and not gate.waiting

        ticket = gate.enter()
        blocker = []

        async def held():
            other = gate.enter()
            await other.wait()
            blocker.append(other)
            await asyncio.sleep(10)

        batch = asyncio.ensure_future(batching.run_items(ticket, 3, item))
        waiter = asyncio.ensure_future(held())
        await asyncio.sleep(0.2)     # item 0 ran, the slot passed to `held`, the batch queued behind it
        assert blocker and gate.running == 1 and len([f for f in gate.waiting if not f.done()]) == 1
        batch.cancel()
        await asyncio.sleep(0)
        ticket.release()
        assert gate.running == 1 and not [f for f in gate.waiting if not f.done()]
        waiter.cancel()
        blocker[0].release()
        assert gate.running == 0

    asyncio.run(scenario())
