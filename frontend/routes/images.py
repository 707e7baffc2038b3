"""POST /v1/images/generations (JSON), POST /v1/images/edits (multipart), GET /files/images/{id}.

Image pipeline REQUEST JSON (omni_backends.qwen_image.serving.image_model): {"task": "generate"|"edit",
"prompt", "negative_prompt", "n", "width", "height", "num_inference_steps", "true_cfg_scale", "seed",
"partial_images"}; edits add INPUT_IMAGES uint8 [K, H, W, 3] + INPUT_IMAGE_SIZES int32 [K, 2] (1-4 images,
zero-padded) and INPUT_MASK uint8 [H, W] (the mask's alpha, the first image's size).
Events: {"type": "progress"}, {"type": "image.partial", "index", "partial_image_index"} + IMAGE,
{"type": "image", "index"} + IMAGE, {"type": "done", "seed", "width", "height", "usage"}.
Every bad input is a 4xx before the pipeline is called: unknown model, empty prompt, malformed size or
more than `max_image_pixels`, n outside 1-10, non-image upload, more than 4 images or an input image over
4096x4096 pixels, an edit without size of an image under 16 pixels a side, mask of another size than the
first image or without alpha, a second `mask` part (`image` / `image[]` take 1-4 files, `mask` one), an
upload over `max_upload_bytes` (413), a JSON body to /edits (415), a pipeline-protocol key (`action`) among
the extension fields, `moderation` other than "auto" (UNSUPPORTED_FIELDS), and a field the pipeline does not read
(400 `unsupported_parameter` naming the field, e.g. `style` or `guidance_scale`, listing the route's fields;
routes.common.refuse_unread_fields), refused before admission.
"""
from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
import time
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.exceptions import RequestValidationError
from pydantic import ConfigDict, Field, ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.datastructures import UploadFile

from omni_frontend import admission, observability
from omni_frontend import images as codec
from omni_frontend import pipeline_stream
from omni_frontend.chat_protocol import unsupported_parameter
from omni_frontend.errors import APIError, bad_request
from omni_frontend.observability import RequestTimer
from omni_frontend.pipelines import IMAGE, Pipeline
from omni_frontend.routes.common import config, form_bool, pipeline_for, refuse_unread_fields, single_part, triton
from omni_frontend.validation import RequestModel, read_form, refuse_unsupported

router = APIRouter()
FILES_PATH = "/files/images/"
MULTIPLE = 16
_SIZE = re.compile(r"^([0-9]{1,5})x([0-9]{1,5})$")
_QUALITIES = ("low", "medium", "high")
MAX_EDIT_IMAGES = 4
MAX_PROMPT_CHARS = 32000
MAX_UPLOAD_PIXELS = 4096 * 4096
# OpenAI image fields no pipeline honours: field -> (values that change nothing, why), as chat's
# (omni_frontend.chat_protocol.UNSUPPORTED_FIELDS). They are not passed on.
UNSUPPORTED_FIELDS: dict[str, tuple[tuple, str]] = {
    "moderation": ((None, "auto"), "the server does not filter images; only 'auto', OpenAI's default"),
}
# The pipeline REQUEST keys `_body` fills from the route's fields (refuse_unread_fields)
_ROUTED_KEYS = ("task", "prompt", "n", "partial_images", "width", "height", "seed", "num_inference_steps",
                "negative_prompt", "true_cfg_scale")


class ImageOptions(RequestModel):
    """The fields both routes share (OpenAI's, then the diffusion extensions). Types are strict, as
    OpenAI's API is typed: `"n": "2"` or `"stream": "true"` in JSON is a 400 naming the field; the edits
    form's strings are converted by `_typed` first."""

    model_config = ConfigDict(extra="allow", strict=True)
    prompt: str
    model: str | None = None
    n: int = Field(default=1, ge=1, le=10)
    size: str | None = None
    response_format: Literal["b64_json", "url"] = "b64_json"
    output_format: Literal["png", "jpeg", "webp"] = "png"
    output_compression: int | None = Field(default=None, ge=0, le=100)
    background: Literal["transparent", "opaque", "auto"] | None = None
    quality: Literal["auto", "low", "medium", "high", "standard", "hd"] | None = None   # gpt-image-1's, dall-e-3's
    stream: bool = False
    partial_images: int = Field(default=0, ge=0, le=3)
    user: str | None = None
    seed: int | None = Field(default=None, ge=0, lt=2 ** 63)
    num_inference_steps: int | None = Field(default=None, ge=1, le=200)
    negative_prompt: str | None = None
    true_cfg_scale: float | None = Field(default=None, ge=0, le=50)


@dataclasses.dataclass
class _Job:
    options: ImageOptions
    pipeline: Pipeline
    task: str
    size: tuple[int, int] | None
    inputs: dict[str, np.ndarray]


def _pipeline(request: Request, model: str | None, task: str) -> Pipeline:
    route = "images/generations" if task == "generate" else "images/edits"
    if model is None:
        found = next((p for p in config(request).pipelines if p.kind == IMAGE and task in p.tasks), None)
        if found is None:
            raise APIError(404, f"no image pipeline for {route} is loaded", param="model", code="model_not_found")
        request.app.state.control.check(found)   # 503 pipeline_sleeping, as when the request names it
        return found
    found = pipeline_for(request, model, IMAGE, "images")
    if task not in found.tasks:
        raise APIError(400, f"model '{model}' does not serve {route}", param="model", code="model_not_supported")
    return found


def _size(request: Request, value: str | None, default: tuple[int, int] | None) -> tuple[int, int] | None:
    """(width, height) checked against the pixel limit; None leaves the choice to the pipeline."""
    limit = config(request).max_image_pixels
    if value in (None, "", "auto"):
        if default is not None and min(default) < MULTIPLE:
            raise bad_request(f"the image is {default[0]}x{default[1]} pixels: without a size the edit takes its size, "
                              f"which needs at least {MULTIPLE} pixels a side", param="image", code="image_too_small")
        size = None if default is None else (default[0] // MULTIPLE * MULTIPLE, default[1] // MULTIPLE * MULTIPLE)
    else:
        match = _SIZE.match(value)
        if not match:
            raise bad_request(f"size must be 'WIDTHxHEIGHT' or 'auto', got {value!r}", param="size",
                              code="invalid_size")
        size = (int(match[1]), int(match[2]))
        if size[0] < MULTIPLE or size[1] < MULTIPLE or size[0] % MULTIPLE or size[1] % MULTIPLE:
            raise bad_request(f"size {value}: width and height must be positive multiples of {MULTIPLE}",
                              param="size", code="invalid_size")
    if size is not None and size[0] * size[1] > limit:
        raise bad_request(f"size {size[0]}x{size[1]} has {size[0] * size[1]} pixels; the limit is {limit}",
                          param="size", code="size_too_large")
    return size


def _check(options: ImageOptions) -> None:
    if not options.prompt.strip():
        raise bad_request("prompt must not be empty", param="prompt", code="empty_prompt")
    for name in ("prompt", "negative_prompt"):
        text = getattr(options, name) or ""
        if len(text) > MAX_PROMPT_CHARS:
            raise bad_request(f"{name} is {len(text)} characters; the limit is {MAX_PROMPT_CHARS}",
                              param=name, code="prompt_too_long")
    if options.background == "transparent":
        raise bad_request("background 'transparent' is not supported: the model paints opaque images",
                          param="background")
    if options.partial_images and not options.stream:
        raise bad_request("partial_images needs stream: true", param="partial_images")


@router.post("/v1/images/generations")
async def generations(options: ImageOptions, request: Request):
    _check(options)
    pipeline = _pipeline(request, options.model, "generate")
    return await _run(request, _Job(options, pipeline, "generate", _size(request, options.size, None), {}))


@router.post("/v1/images/edits")
async def edits(request: Request):
    cfg = config(request)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError(415, "/v1/images/edits takes multipart/form-data (image files and form fields)",
                       code="unsupported_media_type")
    form = await read_form(request, cfg.limits.max_upload_bytes + 1)
    fields = {k: v for k, v in form.multi_items() if not isinstance(v, UploadFile)}
    try:
        options = ImageOptions.model_validate(_typed(fields))
    except ValidationError as exc:  # a form value out of range: 400 naming the field, as for JSON bodies
        raise RequestValidationError(exc.errors()) from exc
    _check(options)
    uploads = [v for k, v in form.multi_items() if k in ("image", "image[]") and isinstance(v, UploadFile)]
    if not uploads:
        raise bad_request("multipart field 'image' is required", param="image")
    if len(uploads) > MAX_EDIT_IMAGES:
        raise bad_request(f"got {len(uploads)} images; at most {MAX_EDIT_IMAGES}", param="image")
    mask = single_part(form, "mask")
    pipeline = _pipeline(request, options.model, "edit")
    pictures = [(await _decode_upload(await _read(upload, cfg.limits.max_upload_bytes, "image"), "image"))[0]
                for upload in uploads]
    try:
        codec.check_padding(pictures, cfg.max_image_pixels)
    except codec.ImageTooLarge as exc:
        raise bad_request(str(exc), param="image", code="image_too_large") from None
    padded, sizes = codec.stack(pictures)
    inputs = {"INPUT_IMAGES": padded, "INPUT_IMAGE_SIZES": sizes}
    pixels = pictures[0]
    if isinstance(mask, UploadFile):
        mask_pixels, alpha = await _decode_upload(await _read(mask, cfg.limits.max_upload_bytes, "mask"), "mask")
        if mask_pixels.shape[:2] != pixels.shape[:2]:
            raise bad_request(f"mask is {mask_pixels.shape[1]}x{mask_pixels.shape[0]} but the image is "
                              f"{pixels.shape[1]}x{pixels.shape[0]}", param="mask", code="mask_size_mismatch")
        if alpha is None:
            raise bad_request("mask must have an alpha channel (transparent where the image is edited)", param="mask")
        inputs["INPUT_MASK"] = alpha
    size = _size(request, options.size, (pictures[-1].shape[1], pictures[-1].shape[0]))
    return await _run(request, _Job(options, pipeline, "edit", size, inputs))


def _typed(fields: dict[str, str]) -> dict:
    """Form strings -> JSON values for the numeric and boolean fields (booleans: true/false, 1/0, yes/no,
    on/off; anything else is a 400 naming the field)."""
    typed: dict = dict(fields)
    for name, value in fields.items():
        if name in ("n", "output_compression", "partial_images", "seed", "num_inference_steps"):
            typed[name] = _number(value, name, int)
        elif name == "true_cfg_scale":
            typed[name] = _number(value, name, float)
        elif name == "stream":
            typed[name] = form_bool(value, name)
    return typed


def _number(value: str, name: str, kind):
    try:
        return kind(value)
    except ValueError:
        raise bad_request(f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}",
                          param=name) from None


async def _read(upload: UploadFile, limit: int, name: str) -> bytes:
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise APIError(413, f"{name} exceeds the {limit} byte upload limit", param=name, code="file_too_large")
    return data


async def _decode_upload(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Decoded off the event loop (large images take tens of milliseconds); more than MAX_UPLOAD_PIXELS is
    refused from the header, before decoding."""
    try:
        return await asyncio.to_thread(codec.decode, data, MAX_UPLOAD_PIXELS)
    except codec.ImageTooLarge as exc:
        raise bad_request(f"{name}: {exc}", param=name, code="image_too_large") from exc
    except codec.ImageDecodeError as exc:
        raise bad_request(f"{name} is not a readable image (png, jpeg, webp, ...): {exc}", param=name,
                          code="invalid_image") from exc


def _extensions(options: ImageOptions) -> dict:
    """The extension fields passed on to the pipeline: the unknown fields but UNSUPPORTED_FIELDS (refused
    unless inert). Raises APIError 400."""
    extra = pipeline_stream.extension_fields(options.model_extra)
    refuse_unsupported(extra, UNSUPPORTED_FIELDS, unsupported_parameter)
    return {k: v for k, v in extra.items() if k not in UNSUPPORTED_FIELDS}


def _body(job: _Job) -> dict:
    o = job.options
    body = {**_extensions(o), "task": job.task, "prompt": o.prompt, "n": o.n, "partial_images": o.partial_images}
    if job.size is not None:
        body["width"], body["height"] = job.size
    extensions = {"seed": o.seed, "num_inference_steps": o.num_inference_steps, "negative_prompt": o.negative_prompt,
                  "true_cfg_scale": o.true_cfg_scale}
    return {**body, **{k: v for k, v in extensions.items() if v is not None}}


def _quality(options: ImageOptions) -> str:
    return options.quality if options.quality in _QUALITIES else "high"


async def _run(request: Request, job: _Job):
    """Fields the pipeline does not read (400), admission (429 at once when the pipeline is full;
    omni_frontend.admission), then the pipeline."""
    route = "/v1/images/generations" if job.task == "generate" else "/v1/images/edits"
    await refuse_unread_fields(request, job.pipeline, route, _extensions(job.options), ImageOptions.model_fields,
                               _ROUTED_KEYS)
    ticket = admission.enter(request, job.pipeline)
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    request_id = request.state.request_id
    stream = pipeline_stream.events(triton(request), job.pipeline.entry, _body(job), request_id,
                                    extra_inputs=job.inputs, payload="IMAGE")
    first = await pipeline_stream.until_disconnect(request, anext(stream, None))  # 4xx before the 200 head
    events = pipeline_stream.prepend(first, stream)
    headers = {"x-request-id": request_id}
    timer = observability.timer(request, job.pipeline.name)   # E2E of completed requests (no TTFT / TTFP: images)
    if job.options.stream:
        return EventSourceResponse(_sse(request, job, events, timer), ping=15, headers=headers)

    async def collect():
        pictures, done = {}, {}
        async for event, image in events:
            if event.get("type") == "image":
                pictures[event["index"]] = image
            elif event.get("type") == "done":
                done = event
        return [pictures[i] for i in sorted(pictures)], done

    pictures, done = await pipeline_stream.until_disconnect(request, collect())
    timer.done()
    o = job.options
    data = [await _item(request, o, image) for image in pictures]
    return {"created": int(time.time()), "data": data, "size": f"{done.get('width')}x{done.get('height')}",
            "output_format": o.output_format, "quality": _quality(o), "background": "opaque",
            "usage": done.get("usage"), "seed": done.get("seed")}


async def _encode(image: np.ndarray, options: ImageOptions) -> bytes:
    """Encoded off the event loop, so that other requests keep streaming meanwhile."""
    return await asyncio.to_thread(codec.encode, image, options.output_format, options.output_compression)


async def _item(request: Request, options: ImageOptions, image: np.ndarray) -> dict:
    data = await _encode(image, options)
    if options.response_format == "b64_json":
        return {"b64_json": base64.b64encode(data).decode()}
    key, expires = request.app.state.images.put(data, codec.CONTENT_TYPES[options.output_format])
    url = f"{str(request.base_url).rstrip('/')}{FILES_PATH}{key}.{options.output_format}"
    return {"url": url, "expires_at": expires}


async def _sse(request: Request, job: _Job, events, timer: RequestTimer):
    o, prefix = job.options, ("image_generation" if job.task == "generate" else "image_edit")
    common = {"background": "opaque", "output_format": o.output_format, "quality": _quality(o)}
    finished = []
    try:
        async for event, image in events:
            kind = event.get("type")
            if kind == "image.partial":
                data = await _encode(image, o)
                yield json.dumps({"type": f"{prefix}.partial_image", "b64_json": base64.b64encode(data).decode(),
                                  "created_at": int(time.time()), "partial_image_index": event["partial_image_index"],
                                  "size": f"{image.shape[1]}x{image.shape[0]}", **common})
            elif kind == "image":
                finished.append(image)
            elif kind == "done":
                timer.done()
                for image in finished:
                    data = await _encode(image, o)
                    yield json.dumps({"type": f"{prefix}.completed", "b64_json": base64.b64encode(data).decode(),
                                      "created_at": int(time.time()), "size": f"{image.shape[1]}x{image.shape[0]}",
                                      "usage": event.get("usage"), **common})
    except APIError as exc:
        yield json.dumps({"type": "error", **exc.body()})


@router.get(FILES_PATH + "{name}")
async def image_file(name: str, request: Request):
    """An image made with `response_format: "url"` (while it lives in the store)."""
    found = request.app.state.images.get(name.rsplit(".", 1)[0])
    if found is None:
        raise APIError(404, "image not found or expired", code="image_not_found")
    return Response(found[0], media_type=found[1])
