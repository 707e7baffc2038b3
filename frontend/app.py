"""FastAPI app factory: OpenAI-compatible routes over Triton gRPC."""
from __future__ import annotations

import asyncio
import hmac

from fastapi import FastAPI

from omni_frontend import errors, observability
from omni_frontend.availability import Availability
from omni_frontend.config import FrontendConfig
from omni_frontend.model_control import ModelControl
from omni_frontend.routes import admin, chat, speech, system, transcriptions
from omni_frontend.stage_monitor import CrashedStubs, StageMonitor
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


def create_app(config: FrontendConfig, crashed_stubs: CrashedStubs | None = None) -> FastAPI:
    """The app for `config`; its Triton client opens lazily and closes on shutdown.

    crashed_stubs: the launcher's `TritonServer.crashed_stubs` (stub processes that died), for stage
    recovery; without it only stale heartbeats reveal a dead stage.
    """
    app = FastAPI(title="Omni-Triton", version="0.1.0")
    app.state.config = config
    availability = Availability({p.entry: p.models for p in config.pipelines})
    app.state.triton = TritonClient(config.triton_url, config.request_timeout_s, availability)
    app.state.control = ModelControl(app.state.triton, config.pipelines)
    app.state.monitor = StageMonitor(app.state.control, availability, config.triton_metrics_url, crashed_stubs,
                                     recover_after_s=config.recover_after_stale_s)
    app.state.metrics = observability.FrontendMetrics()
    errors.install_handlers(app)

    if config.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=config.api_key)
    app.add_middleware(observability.ObservabilityMiddleware, metrics=app.state.metrics)  # outermost
    for module in (system, chat, speech, transcriptions, admin):
        app.include_router(module.router)

    @app.on_event("startup")
    async def _watch_stages():
        if config.recover_stages:
            app.state.monitor_task = asyncio.create_task(app.state.monitor.run())

    @app.on_event("shutdown")
    async def _close():
        task = getattr(app.state, "monitor_task", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await app.state.monitor.stop()
        await app.state.triton.close()

    return app
