"""Pipeline administration (behind the API key when one is set, like every /v1 route):

GET  /v1/admin/pipelines               -> {"object": "list", "data": [pipeline, ...]}
POST /v1/admin/pipelines/{name}/sleep  -> pipeline + {"unloaded", "kept", "pending"}: requests to it get
                                          503 `pipeline_sleeping`; models no other pipeline needs (awake, or
                                          still draining requests) are unloaded (stub processes, memory freed)
POST /v1/admin/pipelines/{name}/wake   -> pipeline + {"loaded"}: its models are loaded again
pipeline = {"id", "object": "pipeline", "state": "awake" | "falling_asleep" | "sleeping" | "waking" | "recovering",
            "triton_models"}: falling_asleep while a sleep drains and unloads, waking while a wake loads.
Unknown name: 404 `pipeline_not_found`; a model that fails to load: 503 `model_control_failed`.

vLLM's whole-server sleep endpoints, for the tools that drive vLLM (same API key):
POST /sleep?level=1|2[&mode=wait] -> {"is_sleeping": true, "pipelines": {name: sleep result}}: every awake pipeline
                                     refuses new requests at once, then each sleeps as above, one after another (a
                                     model of one whose requests are still draining is kept). Both levels free
                                     weights and KV cache alike (the stage processes end; a wake loads from disk);
                                     `mode` "wait" (the default) lets requests in flight finish, vLLM's "abort" and
                                     "keep" are refused (400).
POST /wake_up[?tags=weights&tags=kv_cache] -> {"is_sleeping": false, "pipelines": {name: wake result}}: every
                                     pipeline that is not awake wakes; weights and KV cache always load together.
GET  /is_sleeping                 -> {"is_sleeping": bool}: true when no pipeline is awake.
"""
from __future__ import annotations

from fastapi import APIRouter, Query, Request

from omni_frontend.errors import APIError
from omni_frontend.model_control import AWAKE
from omni_frontend.routes.common import config
from omni_frontend.routes.system import pipeline_state

router = APIRouter(prefix="/v1/admin/pipelines")
engine_router = APIRouter()
SLEEP_LEVELS = (1, 2)
SLEEP_MODES = ("wait",)
WAKE_TAGS = ("weights", "kv_cache")


def _entry(request: Request, name: str) -> dict:
    pipeline = request.app.state.control.pipelines[name]
    return {"id": name, "object": "pipeline", "state": pipeline_state(request, pipeline),
            "triton_models": list(pipeline.models)}


@router.get("")
async def list_pipelines(request: Request):
    return {"object": "list", "data": [_entry(request, p.name) for p in config(request).pipelines]}


@router.post("/{name}/sleep")
async def sleep(name: str, request: Request):
    result = await request.app.state.control.sleep(name)
    return {**_entry(request, name), **result}


@router.post("/{name}/wake")
async def wake(name: str, request: Request):
    result = await request.app.state.control.wake(name)
    return {**_entry(request, name), **result}


@engine_router.post("/sleep")
async def sleep_all(request: Request, level: str = "1", mode: str = "wait"):
    if level.strip() not in {str(n) for n in SLEEP_LEVELS}:
        raise APIError(400, f"level must be one of {', '.join(map(str, SLEEP_LEVELS))}, got {level!r}",
                       param="level", code="invalid_value")
    if mode not in SLEEP_MODES:
        raise APIError(400, f"mode {mode!r} is not supported: a sleep lets the requests in flight finish "
                            "(mode=wait)", param="mode", code="unsupported_value")
    results = await request.app.state.control.sleep_all()
    return {"is_sleeping": True, "pipelines": {name: {**_entry(request, name), **result}
                                               for name, result in results.items()}}


@engine_router.post("/wake_up")
async def wake_all(request: Request, tags: list[str] | None = Query(None)):
    unknown = [t for t in tags or [] if t not in WAKE_TAGS]
    if unknown:
        raise APIError(400, f"unknown wake_up tag {unknown[0]!r}; tags: {', '.join(WAKE_TAGS)}",
                       param="tags", code="invalid_value")
    control = request.app.state.control
    results = {}
    for name in control.pipelines:
        if control.state(name) != AWAKE:
            results[name] = await wake(name, request)
    return {"is_sleeping": False, "pipelines": results}


@engine_router.get("/is_sleeping")
async def is_sleeping(request: Request):
    control = request.app.state.control
    return {"is_sleeping": bool(control.pipelines) and all(control.state(name) != AWAKE for name in control.pipelines)}
