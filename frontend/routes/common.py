"""Helpers shared by routes: app state access and pipeline lookup with OpenAI errors."""
from __future__ import annotations

from collections.abc import Collection

from fastapi import Request
from pydantic import TypeAdapter, ValidationError

from omni_frontend import pipeline_stream

from omni_frontend.config import FrontendConfig
from omni_frontend.errors import APIError, bad_request
from omni_frontend.pipelines import Pipeline
from omni_frontend.triton_client import TritonClient


def config(request: Request) -> FrontendConfig:
    return request.app.state.config


def triton(request: Request) -> TritonClient:
    return request.app.state.triton


_BOOL = TypeAdapter(bool)


def form_bool(value, name: str) -> bool:
    """A multipart boolean field (None/"" = false): true/false, 1/0, yes/no, on/off as pydantic reads
    them; anything else is a 400 naming the field (never silently false)."""
    if value is None or value == "":
        return False
    try:
        return _BOOL.validate_python(value)
    except ValidationError:
        raise bad_request(f"{name} must be a boolean (true or false), got {value!r}", param=name,
                          code="invalid_value") from None


def single_part(form, name: str):
    """The value of multipart field `name` (an UploadFile or a string), None when absent. A field that takes one
    file (a transcription's `file`, an edit's `mask`, a video's `input_reference`) sent more than once is a 400
    naming it (code `too_many_files`): one of the parts used to be dropped silently."""
    parts = form.getlist(name)
    if len(parts) > 1:
        raise bad_request(f"multipart field '{name}' was sent {len(parts)} times; exactly one file is allowed",
                          param=name, code="too_many_files")
    return parts[0] if parts else None


def pipeline_for(request: Request, model: str | None, kind: str, route: str) -> Pipeline:
    """The loaded pipeline of `kind` named by `model`; 404 if none is loaded, 400 if it serves another route,
    503 `pipeline_sleeping` if it sleeps.

    A missing `model` picks the first loaded pipeline of that kind.
    """
    cfg = config(request)
    if not model:
        for p in cfg.pipelines:
            if p.kind == kind:
                request.app.state.control.check(p)
                return p
        raise APIError(404, f"no {kind} pipeline is loaded", param="model", code="model_not_found")
    found = cfg.pipeline(model)
    if found is None:
        loaded = ", ".join(p.name for p in cfg.pipelines if p.kind == kind) or "none"
        raise APIError(404, f"model '{model}' is not loaded; {route} models: {loaded}", param="model",
                       code="model_not_found")
    if found.kind != kind:
        raise APIError(400, f"model '{model}' does not serve {route}", param="model", code="model_not_supported")
    request.app.state.control.check(found)
    return found


async def refuse_unread_fields(request: Request, pipeline: Pipeline, route: str, extra: dict,
                               route_fields: Collection[str], routed: Collection[str] = ()) -> None:
    """Raises APIError 400 (code `unsupported_parameter`, param: the first such key in sorted order) for a
    non-null key of `extra` (the request's extension fields, passed on in the pipeline REQUEST) that `pipeline`
    does not read or that the route sets itself (`routed`: the REQUEST keys it fills from `route_fields`, its
    own fields). Call it before admission: an unread field is refused whatever the load, before the request
    queues or any model works on it. The pipeline's fields are its answer to {"action": "fields"}
    (pipeline_stream.fields), asked once per entry model (only when a request carries extension fields) and
    kept; a pipeline that publishes none is left to refuse such keys itself. The message names the route
    (POST `route`) and the model, adds the pipeline's hint for the key, and lists the fields a client may send:
    `route_fields` and the extension fields the pipeline reads. Raises APIError 5xx when the pipeline cannot
    answer."""
    given = [key for key, value in extra.items() if value is not None]
    if not given:
        return
    known = request.app.state.pipeline_fields
    if pipeline.entry not in known:
        known[pipeline.entry] = await pipeline_stream.fields(triton(request), pipeline.entry, request.state.request_id)
    published = known[pipeline.entry]
    if published is None:
        return
    extensions = set(published["fields"]) - set(routed) - set(route_fields)
    unread = sorted(key for key in given if key not in extensions)
    if unread:
        name = unread[0]
        hint = published.get("hints", {}).get(name)
        listed = ", ".join(sorted({*route_fields, *extensions}))
        raise APIError(400, f"{name} is not a request field of POST {route} with model {pipeline.name}"
                            + (f": {hint}" if hint else "") + f" (its fields: {listed})",
                       param=name, code="unsupported_parameter")
