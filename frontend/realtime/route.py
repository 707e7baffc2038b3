"""WS /v1/realtime?model=<chat pipeline with a VAD stage> (OpenAI Realtime GA) and GET /realtime (browser page).

Authentication when the server has an API key: `Authorization: Bearer KEY` (SDKs), or the browser's
subprotocol `openai-insecure-api-key.KEY`. A client that offers the `realtime` subprotocol gets it back.
A session of an unknown or non-realtime model gets an `error` event, then the socket closes (1008); one
of a sleeping pipeline gets `pipeline_sleeping`, then 1013 (try again later).
"""
from __future__ import annotations

import logging
from pathlib import Path

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import FileResponse

from omni_frontend import observability
from omni_frontend.auth import accepted_subprotocol, offered_subprotocols, websocket_authorized
from omni_frontend.errors import APIError
from omni_frontend.pipelines import CHAT
from omni_frontend.realtime.protocol import ProtocolError, encode, error_event
from omni_frontend.realtime.session import RealtimeSession

router = APIRouter()
log = logging.getLogger("omni_frontend.realtime")
PAGE = Path(__file__).resolve().parent.parent / "static" / "realtime.html"
POLICY_VIOLATION = 1008
TRY_AGAIN_LATER = 1013


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket):
    cfg = websocket.app.state.config
    protocols = offered_subprotocols(websocket)
    await websocket.accept(subprotocol=accepted_subprotocol(protocols, ("realtime",)))
    model = websocket.query_params.get("model")
    pipeline = cfg.pipeline(model, CHAT) if model else next((p for p in cfg.pipelines if p.vad), None)
    problem, close_code = None, POLICY_VIOLATION
    if not websocket_authorized(websocket, cfg.api_key, protocols):
        problem = ProtocolError("invalid or missing API key (Authorization: Bearer ...)", code="invalid_api_key",
                                type="authentication_error")
    elif pipeline is None or pipeline.vad is None or pipeline.asr is None:
        served = ", ".join(p.name for p in cfg.pipelines if p.vad) or "none"
        problem = ProtocolError(f"model {model!r} does not serve realtime sessions; realtime models: {served}",
                                code="model_not_found", param="model")
    else:
        try:
            websocket.app.state.control.check(pipeline)
        except APIError as exc:  # a sleeping pipeline: its models are unloaded
            problem = ProtocolError(exc.message, code=exc.code, param=exc.param, type=exc.type)
            close_code = TRY_AGAIN_LATER
    if problem is not None:
        await websocket.send_text(encode(error_event(problem)))
        await websocket.close(close_code)
        return
    request_id = observability.request_id_of(websocket.headers.get("x-request-id"))
    state = websocket.app.state
    session = RealtimeSession(state.triton, pipeline, model or pipeline.name, websocket.send_text, request_id,
                              state.admission.gate(pipeline.name), state.control, cfg.realtime_speculation_ms,
                              state.metrics.speculations, cfg.limits.max_text_chars)
    log.info("realtime session %s opened (model %s)", request_id, pipeline.name)
    try:
        await session.start()
        await session.run(websocket.receive)
    except Exception:  # noqa: BLE001 - a broken socket ends this session only
        log.exception("realtime session %s ended with an error", request_id)
    finally:
        await session.close()
        log.info("realtime session %s closed", request_id)


@router.get("/realtime", include_in_schema=False)
async def page(request: Request):
    """The browser client: microphone -> /v1/realtime, streamed reply audio, live transcripts."""
    return FileResponse(PAGE, media_type="text/html")
