"""Pipeline administration (behind the API key when one is set, like every /v1 route):

GET  /v1/admin/pipelines               -> {"object": "list", "data": [pipeline, ...]}
POST /v1/admin/pipelines/{name}/sleep  -> pipeline + {"unloaded", "kept", "pending"}: requests to it get
                                          503 `pipeline_sleeping`; models no awake pipeline needs are
                                          unloaded (their stub processes and memory freed)
POST /v1/admin/pipelines/{name}/wake   -> pipeline + {"loaded"}: its models are loaded again
pipeline = {"id", "object": "pipeline", "state": "awake" | "falling_asleep" | "sleeping" | "waking" | "recovering",
            "triton_models"}: falling_asleep while a sleep drains and unloads, waking while a wake loads.
Unknown name: 404 `pipeline_not_found`; a model that fails to load: 503 `model_control_failed`.
"""
from __future__ import annotations

from fastapi import APIRouter, Request

from omni_frontend.routes.common import config
from omni_frontend.routes.system import pipeline_state

router = APIRouter(prefix="/v1/admin/pipelines")


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
