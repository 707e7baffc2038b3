"""GET /health, GET /v1/models, GET /metrics."""
from __future__ import annotations

import time

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from omni_frontend.errors import APIError
from omni_frontend.model_control import AWAKE
from omni_frontend.pipelines import Pipeline
from omni_frontend.routes.common import config, triton

router = APIRouter()
_CREATED = int(time.time())


@router.get("/health")
async def health(request: Request):
    """200 only when tritonserver is live and every model of every awake pipeline is READY, its stub is
    alive (fresh heartbeat), its worker loops run and it is not being restarted; otherwise 503 naming
    the models that are not. Pipelines that are not awake (sleeping, falling_asleep, waking) are listed
    in `sleeping`, not judged: their models unloading or loading fail neither /health nor, through
    Triton's strict readiness (false while any model loads or unloads), the server. Body:
    {"status": "ok" | "unavailable", "models": [awake models], "sleeping": [names],
     "pipelines": {name: state as GET /v1/models}, and when 503 "not_ready", "recovering", "error"}."""
    client = triton(request)
    cfg, control = config(request), request.app.state.control
    models = control.awake_models()
    recovering = [m for m in models if m in client.availability.down()]
    if not await client.server_live():
        return JSONResponse({"status": "unavailable", "not_ready": recovering, "recovering": recovering,
                             "error": "tritonserver is not live" + (f" (restarting: {', '.join(recovering)})"
                                                                    if recovering else "")}, status_code=503)
    not_ready = [m for m in models if not await client.model_ready(m)]
    if cfg.triton_metrics_url:
        try:
            dead = await request.app.state.liveness.unhealthy_models(models, cfg.heartbeat_stale_s)
        except httpx.HTTPError as exc:
            return JSONResponse({"status": "unavailable", "error": f"triton metrics unreachable: {exc}"},
                                status_code=503)
        not_ready += [m for m in dead if m not in not_ready]
    not_ready += [m for m in recovering if m not in not_ready]
    awake = set(control.awake_models())   # a pipeline put to sleep during the probes: its models are not judged
    not_ready = [m for m in not_ready if m in awake]
    body = {"models": [m for m in models if m in awake], "sleeping": sorted(control.sleeping),
            "pipelines": {p.name: pipeline_state(request, p) for p in cfg.pipelines}}
    if not_ready:
        return JSONResponse({"status": "unavailable", **body, "not_ready": not_ready, "recovering": recovering,
                             "error": f"model(s) not ready: {', '.join(not_ready)}"}, status_code=503)
    return {"status": "ok", **body}


def pipeline_state(request: Request, pipeline: Pipeline) -> str:
    """awake | falling_asleep | sleeping | waking (ModelControl.state) | recovering (awake, and a stage of it
    died and is being restarted)."""
    state = request.app.state.control.state(pipeline.name)
    if state == AWAKE and set(pipeline.models) & set(triton(request).availability.down()):
        return "recovering"
    return state


@router.get("/v1/models")
async def list_models(request: Request):
    """OpenAI list shape: every model id the routes accept, as OpenAI lists every id its API takes. First one
    entry per loaded client-facing pipeline, with its state, then one per alias (`whisper-1`, `tts-1`, ...), the
    same but for its id; `pipeline` names the pipeline an id runs."""
    pipelines = [{"id": p.name, "object": "model", "created": _CREATED, "owned_by": "omni-triton", "pipeline": p.name,
                  "kind": p.kind, "state": pipeline_state(request, p), "triton_models": list(p.models),
                  "aliases": list(p.aliases), "description": p.description} for p in config(request).pipelines]
    aliases = [{**entry, "id": alias} for entry in pipelines for alias in entry["aliases"]]
    return {"object": "list", "data": pipelines + aliases}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request):
    """The list's entry of `model_id` (its `id` is the id asked for, also for an alias); 404 `model_not_found`."""
    for entry in (await list_models(request))["data"]:
        if entry["id"] == model_id:
            return entry
    raise APIError(404, f"model '{model_id}' not found", param="model", code="model_not_found")


@router.get("/metrics")
async def metrics(request: Request):
    """Prometheus text: the frontend's omni_frontend_* families, then Triton's own page (nv_* and the stages'
    omni_* families, read from Triton's metrics port, which listens on 127.0.0.1 only), so that one scrape of the
    public port sees everything. Triton's part is replaced by a comment line when it cannot be read."""
    page = generate_latest(request.app.state.metrics.registry).decode()
    if request.app.state.liveness is not None:
        try:
            page += await request.app.state.liveness.metrics_text()
        except httpx.HTTPError as exc:
            page += f"# triton metrics unreachable: {type(exc).__name__}\n"
    return Response(page, media_type=CONTENT_TYPE_LATEST)
