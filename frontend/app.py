"""FastAPI app factory: OpenAI-compatible routes over Triton gRPC."""
from __future__ import annotations

import hmac

from fastapi import FastAPI, Request

from omni_frontend import errors, observability
from omni_frontend.config import FrontendConfig
from omni_frontend.routes import chat, speech, system, transcriptions
from omni_frontend.triton_client import TritonClient

_OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json")


def create_app(config: FrontendConfig) -> FastAPI:
    """The app for `config`; its Triton client opens lazily and closes on shutdown."""
    app = FastAPI(title="Omni-Triton", version="0.1.0")
    app.state.config = config
    app.state.triton = TritonClient(config.triton_url, config.request_timeout_s)
    app.state.metrics = observability.FrontendMetrics()
    errors.install_handlers(app)

    if config.api_key:
        @app.middleware("http")
        async def _auth(request: Request, call_next):
            if not request.url.path.startswith(_OPEN_PATHS):
                token = request.headers.get("authorization", "")
                if not hmac.compare_digest(token.encode(), f"Bearer {config.api_key}".encode()):
                    return errors.APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                                           code="invalid_api_key").response()
            return await call_next(request)

    observability.install(app, app.state.metrics)  # outermost: sees auth failures too
    for module in (system, chat, speech, transcriptions):
        app.include_router(module.router)

    @app.on_event("shutdown")
    async def _close():
        await app.state.triton.close()

    return app
