"""FastAPI app factory: OpenAI-compatible routes over Triton gRPC."""
from __future__ import annotations

import hmac

from fastapi import FastAPI

from omni_frontend import errors, observability
from omni_frontend.liveness import HeartbeatReader
from omni_frontend.config import FrontendConfig
from omni_frontend.routes import chat, speech, system, transcriptions
from omni_frontend.triton_client import TritonClient

_OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json")


class BearerAuthMiddleware:
    """Pure ASGI middleware: /v1 routes need `Authorization: Bearer <api_key>` (401 otherwise)."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not scope["path"].startswith(_OPEN_PATHS):
            token = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(token, self.expected):
                response = errors.APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                                           code="invalid_api_key").response()
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(config: FrontendConfig) -> FastAPI:
    """The app for `config`; its Triton client opens lazily and closes on shutdown."""
    app = FastAPI(title="Omni-Triton", version="0.1.0")
    app.state.config = config
    app.state.triton = TritonClient(config.triton_url, config.request_timeout_s)
    app.state.liveness = HeartbeatReader(config.triton_metrics_url) if config.triton_metrics_url else None
    app.state.metrics = observability.FrontendMetrics()
    errors.install_handlers(app)

    if config.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=config.api_key)
    app.add_middleware(observability.ObservabilityMiddleware, metrics=app.state.metrics)  # outermost
    for module in (system, chat, speech, transcriptions):
        app.include_router(module.router)

    @app.on_event("shutdown")
    async def _close():
        await app.state.triton.close()
        if app.state.liveness is not None:
            await app.state.liveness.close()

    return app
