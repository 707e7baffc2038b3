"""Request ids, access logs and Prometheus metrics of the frontend (Triton's own metrics stay on
Triton's metrics port)."""
from __future__ import annotations

import logging
import time
import uuid

from prometheus_client import CollectorRegistry, Counter, Histogram

log = logging.getLogger("omni_frontend")


class FrontendMetrics:
    """omni_frontend_requests_total{route, method, status}; omni_frontend_request_seconds{route}
    (time to the response head; streamed bodies continue after it);
    omni_frontend_stream_seconds{route} (whole streamed responses)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("omni_frontend_requests", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("omni_frontend_request_seconds", "Time to response head",
                                 ["route"], registry=self.registry)
        self.stream = Histogram("omni_frontend_stream_seconds", "Duration of streamed responses",
                                ["route"], registry=self.registry)


class ObservabilityMiddleware:
    """Pure ASGI middleware (BaseHTTPMiddleware would hide client disconnects from the routes):
    x-request-id in and out (`request.state.request_id`), one access-log line, metrics."""

    def __init__(self, app, metrics: FrontendMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        incoming = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = incoming or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        start, status = time.perf_counter(), [500]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                headers = list(message.get("headers") or [])
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
                self.metrics.latency.labels(_route(scope)).observe(time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            path = _route(scope)
            self.metrics.requests.labels(path, scope["method"], str(status[0])).inc()
            log.info("%s %s -> %d %.1f ms request_id=%s", scope["method"], scope["path"], status[0],
                     (time.perf_counter() - start) * 1000, request_id)


def _route(scope) -> str:
    return getattr(scope.get("route"), "path", "unmatched")
