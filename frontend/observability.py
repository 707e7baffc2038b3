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


def install(app, metrics: FrontendMetrics) -> None:
    """Adds the middleware: x-request-id in and out, one access-log line, metrics."""

    @app.middleware("http")
    async def _observe(request, call_next):
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        request.state.request_id = request_id
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        elapsed = time.perf_counter() - start
        metrics.requests.labels(path, request.method, str(response.status_code)).inc()
        metrics.latency.labels(path).observe(elapsed)
        response.headers["x-request-id"] = request_id
        log.info("%s %s -> %d %.1f ms request_id=%s", request.method, request.url.path,
                 response.status_code, elapsed * 1000, request_id)
        return response
