"""FastAPI app factory: OpenAI-compatible routes over Triton gRPC."""
from __future__ import annotations

import asyncio
import contextlib

from fastapi import Depends, FastAPI

from omni_frontend import admission, errors, observability
from omni_frontend.auth import bearer_matches
from omni_frontend.availability import Availability
from omni_frontend.liveness import HeartbeatReader
from omni_frontend.config import FrontendConfig
from omni_frontend.image_store import ImageStore
from omni_frontend.model_control import ModelControl
from omni_frontend.realtime import route as realtime
from omni_frontend.routes import (admin, audio_generate, chat, completions, images, responses, speech, speech_batch,
                                  speech_stream, system, tokenize, transcriptions, videos)
from omni_frontend.stage_monitor import CrashedStubs, StageMonitor
from omni_frontend.stopping import Stopping
from omni_frontend.triton_client import TritonClient
from omni_frontend.validation import BodyLimitMiddleware, require_valid_text

# the realtime page too: a browser opening it sends no Authorization header (the page asks for the key and
# sends it on the WebSocket, which checks it: omni_frontend.realtime.route)
_OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json", "/realtime", images.FILES_PATH)


class BearerAuthMiddleware:
    """Pure ASGI middleware: HTTP routes outside _OPEN_PATHS need `Authorization: Bearer <api_key>` (401
    otherwise; the scheme name in any case, as RFC 9110 makes it)."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not scope["path"].startswith(_OPEN_PATHS):
            if not bearer_matches(dict(scope.get("headers") or []).get(b"authorization", b""), self.api_key):
                response = errors.APIError(401, "invalid or missing API key (Authorization: Bearer ...)",
                                           code="invalid_api_key").response()
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    """Startup: the video runner, then the stage monitor (when stage recovery is on). Shutdown, in order: video
    jobs stop, the monitor stops, then the Triton channel and the heartbeat reader close."""
    app.state.stopping.bind(asyncio.get_running_loop())   # the launcher tells it when the stop begins
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_close_clients, app)
        stack.push_async_callback(_stop_monitor, app)
        await stack.enter_async_context(videos.running(app))
        if app.state.config.recover_stages:
            app.state.monitor_task = asyncio.create_task(app.state.monitor.run())
        yield


async def _stop_monitor(app: FastAPI) -> None:
    task = getattr(app.state, "monitor_task", None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await app.state.monitor.stop()


async def _close_clients(app: FastAPI) -> None:
    await app.state.triton.close()
    if app.state.liveness is not None:
        await app.state.liveness.close()


class HeadAsGetMiddleware:
    """Pure ASGI middleware: HEAD on a GET route answers what GET would, without the body (RFC 9110 9.3.2;
    uptime checkers, load balancers and `curl -I` send HEAD). The routes see GET; the body they produce is not
    sent (uvicorn, which sees the HEAD, sends none either), its headers are."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message):
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


def create_app(config: FrontendConfig, crashed_stubs: CrashedStubs | None = None) -> FastAPI:
    """The app for `config`; its Triton client opens lazily and closes on shutdown.

    Edge checks before any route work: request bodies past `config.limits.max_body_bytes` get 413
    unparsed, and JSON text must be valid Unicode (omni_frontend.validation). Middlewares, outermost
    first: observability (request id, access log, metrics), HEAD as GET, catch-all 500, body limit, admission
    slot release, Bearer auth.

    crashed_stubs: the launcher's `TritonServer.crashed_stubs` (stub processes that died), for stage
    recovery (omni_frontend.stage_monitor); without it only stale heartbeats reveal a dead stage."""
    app = FastAPI(title="Omni-Triton", version="0.1.0", dependencies=[Depends(require_valid_text)],
                  lifespan=_lifespan)
    app.state.config = config
    availability = Availability({p.entry: p.models for p in config.pipelines})
    app.state.triton = TritonClient(config.triton_url, config.request_timeout_s, availability)
    app.state.liveness = HeartbeatReader(config.triton_metrics_url) if config.triton_metrics_url else None
    app.state.control = ModelControl(app.state.triton, config.pipelines, availability)
    app.state.monitor = StageMonitor(app.state.control, availability, app.state.liveness, crashed_stubs,
                                     recover_after_s=config.recover_after_stale_s)
    app.state.metrics = observability.FrontendMetrics()
    app.state.stopping = Stopping()   # requests in flight at the stop end with a 503 envelope or SSE error event
    app.state.admission = admission.Admission(config.admission, app.state.metrics)
    app.state.images = ImageStore(config.image_url_ttl_s)
    app.state.pipeline_fields = {}   # entry model -> its {"action": "fields"} answer (refuse_unread_fields)
    errors.install_handlers(app)

    if config.api_key:
        app.add_middleware(BearerAuthMiddleware, api_key=config.api_key)
    app.add_middleware(admission.AdmissionMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.limits.max_body_bytes)
    app.add_middleware(errors.CatchAllMiddleware)
    app.add_middleware(HeadAsGetMiddleware)
    app.add_middleware(observability.ObservabilityMiddleware, metrics=app.state.metrics,
                       send_timeout_s=config.limits.send_timeout_s, stopping=app.state.stopping)  # outermost
    for module in (system, chat, responses, completions, tokenize, speech, speech_batch, speech_stream, audio_generate,
                   transcriptions, images, videos, realtime, admin):
        app.include_router(module.router)
    app.include_router(admin.engine_router)
    videos.install(app, config, app.state.triton)
    return app
