"""Request ids, access logs and Prometheus metrics of the frontend (Triton's own metrics stay on
Triton's metrics port).

Metric names (all on the frontend's GET /metrics; `pipeline` is the OpenAI model id, e.g. `voice`):
  omni_frontend_requests_total{route, method, status}   HTTP requests; 499 = the client went away
                                                        before its response was complete
  omni_frontend_request_seconds{route}                  time to the response head
  omni_frontend_stream_seconds{route}                   whole streamed responses
  omni_frontend_ttft_seconds{pipeline}                  arrival -> first text delta (chat)
  omni_frontend_ttfp_seconds{pipeline}                  arrival -> first audio packet (chat with audio, speech)
  omni_frontend_e2e_seconds{pipeline}                   arrival -> last event of a completed request
  omni_frontend_rtf{pipeline}                           real-time factor: E2E / seconds of audio produced
                                                        (chat, speech) or transcribed (transcription)
  omni_frontend_inflight_requests{pipeline}             requests holding an admission slot
  omni_frontend_queued_requests{pipeline}               requests waiting for a slot
  omni_frontend_queue_wait_seconds{pipeline}            time queued requests waited for their slot
  omni_frontend_overload_rejections_total{pipeline}     requests refused with 429
  omni_frontend_realtime_speculations_total{outcome}    realtime responses started at a pause in the user's
                                                        speech: adopted (the turn ended there) or abandoned
All times are measured from the moment the request reached the frontend, so queueing is included.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from omni_frontend.client_text import printable
from omni_frontend.stopping import Stopping, stopped_error

log = logging.getLogger("omni_frontend")
CLIENT_CLOSED = 499   # nginx's "client closed request"; never a server error

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class FrontendMetrics:
    """The frontend's Prometheus registry (names in the module docstring)."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("omni_frontend_requests", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("omni_frontend_request_seconds", "Time to response head", ["route"], registry=r)
        self.stream = Histogram("omni_frontend_stream_seconds", "Duration of streamed responses", ["route"], registry=r)
        self.ttft = Histogram("omni_frontend_ttft_seconds", "Time to first text delta", ["pipeline"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.ttfp = Histogram("omni_frontend_ttfp_seconds", "Time to first audio packet", ["pipeline"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("omni_frontend_e2e_seconds", "Time to the last event of completed requests",
                             ["pipeline"], buckets=_E2E_BUCKETS, registry=r)
        self.rtf = Histogram("omni_frontend_rtf", "Real-time factor: E2E / audio seconds", ["pipeline"],
                             buckets=_RTF_BUCKETS, registry=r)
        self.inflight = Gauge("omni_frontend_inflight_requests", "Requests holding an admission slot",
                              ["pipeline"], registry=r)
        self.queued = Gauge("omni_frontend_queued_requests", "Requests waiting for an admission slot",
                            ["pipeline"], registry=r)
        self.queue_wait = Histogram("omni_frontend_queue_wait_seconds", "Wait for an admission slot",
                                    ["pipeline"], buckets=_E2E_BUCKETS, registry=r)
        self.rejected = Counter("omni_frontend_overload_rejections", "Requests refused with 429", ["pipeline"],
                                registry=r)
        self.speculations = Counter("omni_frontend_realtime_speculations",
                                    "Realtime responses started at a speech pause, by outcome", ["outcome"], registry=r)


class RequestTimer:
    """Per-request TTFT / TTFP / E2E / RTF of one pipeline. `started` is the request's arrival
    (perf_counter seconds, `request.state.started`). Call `text()` on each text delta,
    `audio(seconds)` on each audio packet, `done(input_audio_s=...)` once when it completed."""

    def __init__(self, metrics: FrontendMetrics, pipeline: str, started: float):
        self.metrics, self.pipeline, self.started = metrics, pipeline, started
        self.audio_s = 0.0
        self._text_seen = self._audio_seen = False

    def text(self) -> None:
        if not self._text_seen:
            self._text_seen = True
            self.metrics.ttft.labels(self.pipeline).observe(time.perf_counter() - self.started)

    def audio(self, seconds: float) -> None:
        if not self._audio_seen:
            self._audio_seen = True
            self.metrics.ttfp.labels(self.pipeline).observe(time.perf_counter() - self.started)
        self.audio_s += seconds

    def done(self, input_audio_s: float | None = None) -> None:
        """Records E2E, and RTF against the audio produced (or `input_audio_s` for transcription)."""
        e2e = time.perf_counter() - self.started
        self.metrics.e2e.labels(self.pipeline).observe(e2e)
        audio_s = input_audio_s if input_audio_s is not None else self.audio_s
        if audio_s > 0:
            self.metrics.rtf.labels(self.pipeline).observe(e2e / audio_s)


_CLIENT_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")   # 1-128 visible ASCII characters


def request_id_of(incoming: str | bytes | None) -> str:
    """The id of a request or WebSocket session: the client's `x-request-id` header value when it is 1-128 visible
    ASCII characters, else (absent, longer, or holding blanks, control or non-ASCII characters) a fresh uuid4 hex.
    The id is echoed in the response's x-request-id header, logged, sent to Triton and part of response ids
    (`chatcmpl-`, `resp_`), so a client's id of 60 000 characters or with blanks is not taken."""
    if isinstance(incoming, bytes):
        incoming = incoming.decode("latin-1")
    return incoming if incoming and _CLIENT_REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex


def timer(request, pipeline: str) -> RequestTimer:
    """The RequestTimer of this request (measured from its arrival at the frontend)."""
    return RequestTimer(request.app.state.metrics, pipeline, request.state.started)


class SlowClient(Exception):
    """The client did not take the next part of a streamed response within the send timeout."""


class ObservabilityMiddleware:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from the routes):
    x-request-id in and out (`request.state.request_id`), arrival time (`request.state.started`),
    one access-log line and the request metrics. A request whose client went away before its
    response was complete is logged and counted as 499, whatever status its head had.

    A part of a streamed response (a body message with more to follow) that the client does not take within
    `send_timeout_s` (None: no limit) raises SlowClient into the response, which ends it (the stream is closed,
    cancelling its pipeline request, and the admission slot is freed); the connection is then closed and the
    request counted as 499 like a client that left. A client that stopped reading used to hold its slot for
    good. Whole bodies sent at once are not timed (a large answer to a slow but reading client)."""

    def __init__(self, app, metrics: FrontendMetrics, send_timeout_s: float | None = None,
                 stopping: Stopping | None = None):
        self.app, self.metrics, self.send_timeout_s = app, metrics, send_timeout_s
        self.stopping = stopping or Stopping()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = request_id_of(dict(scope.get("headers") or []).get(b"x-request-id"))
        start = time.perf_counter()
        state = scope.setdefault("state", {})
        state["request_id"], state["started"] = request_id, start
        status, complete, client_gone = [500], [False], [False]
        started, event_stream, cut = [False], [False], [False]

        async def receive_watching():
            message = await receive()
            if message["type"] == "http.disconnect":
                client_gone[0] = True
            return message

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0], started[0] = message["status"], True
                headers = list(message.get("headers") or [])
                event_stream[0] = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                                      for k, v in headers)
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
                self.metrics.latency.labels(_route(scope)).observe(time.perf_counter() - start)
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete[0] = True
            elif message["type"] == "http.response.body" and self.send_timeout_s is not None:
                try:
                    async with asyncio.timeout(self.send_timeout_s):
                        await send(message)
                except TimeoutError:
                    raise SlowClient(f"the client took no part of the response for {self.send_timeout_s:g} s") \
                        from None
                return
            await send(message)

        try:
            try:
                async with self.stopping.cutoff() as cutoff:
                    await self.app(scope, receive_watching, send_with_id)
            except TimeoutError:
                if not cutoff.expired():
                    raise
                cut[0] = True   # still running when the stop's grace ran out: cancelled there
            if self.stopping.begun and not complete[0] and not client_gone[0]:
                cut[0] = True   # an SSE stream that sse_starlette ended when the stop began, or cut above
                await self._answer_stopped(send_with_id, started[0], event_stream[0])
        except SlowClient:
            client_gone[0] = True   # the response stays incomplete: the server closes the connection
        except asyncio.CancelledError:
            client_gone[0] = True   # the server cancels a request's task when its client has gone
            raise
        except Exception:
            status[0] = 500   # a response broken off by a server error after its head (CatchAllMiddleware re-raised)
            raise
        finally:
            final = CLIENT_CLOSED if client_gone[0] and not complete[0] else status[0]
            self.metrics.requests.labels(_route(scope), scope["method"], str(final)).inc()
            log.info("%s %s -> %d %.1f ms request_id=%s%s", scope["method"], printable(scope["path"]), final,
                     (time.perf_counter() - start) * 1000, request_id, " (cut by the server's stop)" if cut[0] else "")

    @staticmethod
    async def _answer_stopped(send, started: bool, event_stream: bool) -> None:
        """The end of a request that the server's stop cut: a 503 envelope (Retry-After) when no response had
        started, an SSE error event closing the stream when an event stream had; any other response stays cut
        (uvicorn closes the connection: a truncated body is how it must end)."""
        error = stopped_error()
        if not started:
            response = error.response()
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": response.raw_headers})
            await send({"type": "http.response.body", "body": response.body, "more_body": False})
        elif event_stream:
            body = json.dumps(error.body(), separators=(",", ":")).encode()
            await send({"type": "http.response.body", "body": b"data: " + body + b"\r\n\r\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _route(scope) -> str:
    return getattr(scope.get("route"), "path", "unmatched")
