"""The OpenAI Videos job API for video pipelines (e.g. `wan`): create, retrieve, list, download, delete.

    POST   /v1/videos                      JSON or multipart -> video object (status "queued")
    POST   /v1/videos/sync                 the same -> the finished MP4 (vLLM-Omni's blocking create)
    GET    /v1/videos/{id}                 video object (status, progress 0..100, error)
    GET    /v1/videos?limit&after&order    {"object": "list", "data", "first_id", "last_id", "has_more"}
    GET    /v1/videos/{id}/content?variant=video|thumbnail|spritesheet   MP4 | WebP | JPEG
    DELETE /v1/videos/{id}                 cancels a running job, removes its files -> video.deleted

Create fields: `prompt` (required), `model`, `seconds`, `size` ("WxH"), `input_reference` (one image file,
or {"image_url": data URL} in JSON), and the extensions `seed`, `num_inference_steps`, `fps`,
`num_frames` (4k+1, instead of `seconds`; with both, `seconds` must make that many frames,
else a 400), `guidance_scale`, `guidance_scale_2` (Wan2.2's low-noise expert),
`negative_prompt`. Defaults and limits
come from the pipeline (its `describe` action). Jobs run in the background (omni_frontend.videos.runner)
and live in the job store under `--data-dir` (omni_frontend.videos.store).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import math
import os
import re
import secrets
import time
import uuid
from typing import Literal

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import ConfigDict, Field, ValidationError
from starlette.datastructures import Headers, UploadFile
from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable

from omni_frontend.config import FrontendConfig
from omni_frontend.errors import APIError, bad_request
from omni_frontend.observability import CLIENT_CLOSED
from omni_frontend.pipeline_stream import until_disconnect
from omni_frontend.pipelines import VIDEO
from omni_frontend.routes.common import config, pipeline_for, single_part
from omni_frontend.videos import encoding
from omni_frontend.videos.runner import VideoRunner, save_reference
from omni_frontend.videos.store import COMPLETED, FAILED, VideoStore
from omni_frontend.validation import RequestModel, read_form

router = APIRouter()
_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")
MAX_SEED = 2**63 - 1
MAX_PROMPT_CHARS = 10_000
POLL_AFTER_MS = 500  # the openai SDK's `videos.poll` waits this long between polls (header below)
SYNC_TIMEOUT_S = 600.0   # POST /v1/videos/sync waits at most this long (vLLM-Omni's VLLM_OMNI_VIDEO_SYNC_TIMEOUT)
SYNC_POLL_S = 0.2


class VideoCreateRequest(RequestModel):
    """POST /v1/videos fields (JSON: strict types; multipart: strings converted)."""

    model_config = ConfigDict(extra="forbid")
    prompt: str = Field(max_length=MAX_PROMPT_CHARS)
    model: str | None = None
    seconds: str | int | float | None = None
    size: str | None = None
    input_reference: dict | None = None
    user: str | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    num_inference_steps: int | None = Field(default=None, ge=1)
    fps: int | None = Field(default=None, ge=1, le=120)
    num_frames: int | None = Field(default=None, ge=1)
    guidance_scale: float | None = Field(default=None, ge=0.0, le=100.0)
    guidance_scale_2: float | None = Field(default=None, ge=0.0, le=100.0)
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)


def install(app: FastAPI, cfg: FrontendConfig, triton) -> None:
    """Creates the job store and its runner when a video pipeline is loaded (app.state.videos, else None);
    `running(app)` starts and stops them."""
    named = {name: p for p in cfg.pipelines if p.kind == VIDEO for name in (p.name, *p.aliases)}
    entries = {name: p.entry for name, p in named.items()}
    app.state.videos = None
    if entries:
        app.state.videos = VideoRunner(VideoStore(cfg.data_dir), triton, entries, max_queued=cfg.max_queued_videos,
                                       max_running=cfg.max_running_videos, ttl_s=cfg.video_ttl_s or None,
                                       control=app.state.control,
                                       pipelines={name: p.name for name, p in named.items()})


@contextlib.asynccontextmanager
async def running(app: FastAPI):
    """The app's video runner (if `install` made one) runs inside this context; on exit its jobs stop and the
    store closes. Exit it before Triton's channel closes."""
    runner = app.state.videos
    if runner is None:
        yield
        return
    await runner.start()
    try:
        yield
    finally:
        await runner.stop()
        runner.store.close()


def _runner(request: Request) -> VideoRunner:
    runner = request.app.state.videos
    if runner is None:
        raise APIError(404, "no video pipeline is loaded (start the server with --pipelines wan)",
                       code="model_not_found")
    return runner


def _job(runner: VideoRunner, video_id: str):
    job = runner.store.get(video_id)
    if job is None:
        raise APIError(404, f"video '{video_id}' not found", param="video_id", code="video_not_found")
    return job


async def _fields(request: Request, max_bytes: int) -> tuple[dict, bytes | None, bool]:
    """(fields, reference image bytes or None, came from a form) of a JSON or multipart body."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await read_form(request, max_bytes + 1)
        single_part(form, "input_reference")   # one reference image: a second part is a 400
        fields, image = {}, None
        for key, value in form.multi_items():
            if key == "input_reference" and isinstance(value, UploadFile):
                image = await value.read()
                if len(image) > max_bytes:
                    raise APIError(413, f"input_reference is larger than {max_bytes} bytes", param="input_reference")
            elif key.startswith("input_reference[") and key.endswith("]"):  # {"image_url": ...} sent as a form
                fields.setdefault("input_reference", {})[key[16:-1]] = value
            elif isinstance(value, UploadFile):
                raise bad_request(f"{key} must not be a file", param=key)
            else:
                fields[key] = value
        return fields, image, True
    try:
        body = await request.json()
    except ValueError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body, None, False


def _reference_image(reference: dict | None, upload: bytes | None, max_pixels: int):
    """Decodes the reference image: an uploaded file or a base64 data URL (`image_url`)."""
    if upload is None and reference is None:
        return None
    if upload is None:
        url = reference.get("image_url")
        if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
            raise bad_request("input_reference needs an image file or {\"image_url\": \"data:image/...;base64,...\"} "
                              "(remote URLs and file ids are not fetched)", param="input_reference")
        try:
            upload = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
        except binascii.Error as exc:
            raise bad_request(f"input_reference: bad base64 data: {exc}", param="input_reference") from exc
    try:
        return encoding.decode_image(upload, max_pixels)
    except ValueError as exc:
        raise bad_request(f"input_reference: {exc}", param="input_reference", code="invalid_image") from exc


def resolve_params(req: VideoCreateRequest, described: dict) -> tuple[dict, str, str]:
    """Pipeline REQUEST fields, the `seconds` string and the `size` string for a create request, with the
    pipeline's defaults filled in. Raises APIError 400 naming the field that breaks a limit."""
    defaults, limits = described["defaults"], described["limits"]
    size = req.size or defaults["size"]
    match = _SIZE.match(size)
    if not match:
        raise bad_request(f"size must look like WIDTHxHEIGHT (e.g. {defaults['size']}), got {size!r}", param="size")
    width, height = int(match[1]), int(match[2])
    multiple = limits["size_multiple"]
    if width % multiple or height % multiple or not (multiple <= width <= limits["max_width"]) \
            or not (multiple <= height <= limits["max_height"]):
        raise bad_request(f"size {size} is not supported: width and height must be multiples of {multiple}, "
                          f"at most {limits['max_width']}x{limits['max_height']}", param="size")
    fps = req.fps or defaults["fps"]
    step = limits["frame_step"]
    if req.num_frames is not None and (req.num_frames - 1) % step:
        raise bad_request(f"num_frames must be {step}k+1 (e.g. {4 * step + 1}), got {req.num_frames}",
                          param="num_frames")
    if req.num_frames is not None and req.seconds is None:
        frames, seconds = req.num_frames, f"{(req.num_frames - 1) / fps:g}"
    else:
        seconds = str(req.seconds if req.seconds is not None else defaults["seconds"])
        try:
            duration = float(seconds)
        except ValueError:
            duration = -1.0
        if not (duration > 0 and math.isfinite(duration * fps)):  # "inf" / "1e308" overflowed to a 500
            raise bad_request(f"seconds must be a positive number, got {seconds!r}", param="seconds")
        frames = max(1, round(duration * fps / step)) * step + 1
        if req.num_frames is not None and req.num_frames != frames:   # the job would state a wrong length
            raise bad_request(f"seconds {seconds} at {fps} fps makes {frames} frames but num_frames is "
                              f"{req.num_frames}: give one of them (or both agreeing)", param="num_frames",
                              code="conflicting_parameters")
    if frames > limits["max_frames"]:
        raise bad_request(f"{frames} frames ({seconds} s at {fps} fps) is more than this model's limit of "
                          f"{limits['max_frames']}", param="num_frames" if req.num_frames else "seconds")
    steps = req.num_inference_steps or defaults["num_inference_steps"]
    if steps > limits["max_inference_steps"]:
        raise bad_request(f"num_inference_steps must be at most {limits['max_inference_steps']}",
                          param="num_inference_steps")
    params = {"prompt": req.prompt, "negative_prompt": req.negative_prompt if req.negative_prompt is not None
              else defaults.get("negative_prompt", ""), "width": width, "height": height, "num_frames": frames,
              "fps": fps, "num_inference_steps": steps,
              "guidance_scale": req.guidance_scale if req.guidance_scale is not None else defaults["guidance_scale"],
              "seed": req.seed if req.seed is not None else secrets.randbits(31)}
    if req.guidance_scale_2 is not None:
        params["guidance_scale_2"] = req.guidance_scale_2
    return params, seconds, size


@router.post("/v1/videos")
async def create_video(request: Request):
    return (await _create(request, _runner(request))).to_object()


@router.post("/v1/videos/sync")
async def create_video_sync(request: Request):
    """vLLM-Omni's blocking create: the same fields as POST /v1/videos; answers the finished MP4 (header
    `x-video-id`: the job, kept in the store as any other). The job queues and runs as any other; a client that
    leaves cancels and deletes it. Raises the create's errors, APIError 500 (the job's error code and message)
    when generation failed, 409 `video_deleted` when a DELETE removed it meanwhile, 504 `video_sync_timeout` after
    SYNC_TIMEOUT_S (the job goes on: poll it by its id; a job whose pipeline sleeps waits for the wake, so for up to
    that long)."""
    runner = _runner(request)
    job_id = (await _create(request, runner)).id
    try:
        job = await until_disconnect(request, _finished(runner, job_id))
    except APIError as exc:
        if exc.status == CLIENT_CLOSED:
            await runner.cancel(job_id)
            runner.store.delete(job_id)
        raise
    if job is not None and job.status != COMPLETED:
        error = job.error or {}
        raise APIError(500, f"video '{job_id}' failed: {error.get('message', 'unknown error')}",
                       code=error.get("code", "video_failed"), headers={"x-video-id": job_id})
    file = None if job is None else _content(runner, job_id, "video", headers={"x-video-id": job_id})
    if file is None:   # deleted (or expired) while the request waited, or since it completed
        raise APIError(409, f"video '{job_id}' was deleted while the request waited for it", code="video_deleted")
    return file


async def _finished(runner: VideoRunner, video_id: str):
    """The job once it is completed or failed (polled every SYNC_POLL_S), None once it is deleted. Raises
    APIError 504 `video_sync_timeout` after SYNC_TIMEOUT_S."""
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while time.monotonic() < deadline:
        job = runner.store.get(video_id)
        if job is None or job.status in (COMPLETED, FAILED):
            return job
        await asyncio.sleep(SYNC_POLL_S)
    raise APIError(504, f"video '{video_id}' did not finish within {SYNC_TIMEOUT_S:g} s; it goes on: GET "
                        f"/v1/videos/{video_id}", code="video_sync_timeout", headers={"x-video-id": video_id})


async def _create(request: Request, runner: VideoRunner):
    """Validates a create request (JSON or multipart) and queues its job; returns the job (status queued)."""
    cfg = config(request)
    raw, upload, from_form = await _fields(request, cfg.limits.max_upload_bytes)
    try:
        req = VideoCreateRequest.model_validate(raw, strict=not from_form)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from exc
    if not req.prompt.strip():
        raise bad_request("prompt must not be empty", param="prompt", code="empty_prompt")
    pipeline = pipeline_for(request, req.model, VIDEO, "videos")  # an unknown model: 404, as on every route
    described = await runner.describe(pipeline.name)
    params, seconds, size = resolve_params(req, described)
    image = _reference_image(req.input_reference, upload, described["limits"]["max_reference_pixels"])
    if image is not None and not described["image_to_video"]:
        raise bad_request(f"model '{pipeline.name}' generates video from text only: its checkpoint has no "
                          f"image-to-video support, so input_reference cannot be used", param="input_reference",
                          code="unsupported_parameter")
    runner.check_capacity()
    video_id = f"video_{uuid.uuid4().hex}"
    model = req.model or pipeline.name
    job = runner.store.create(video_id, model=model, prompt=req.prompt, seconds=seconds, size=size, params=params)
    if image is not None:
        save_reference(runner.store, video_id, image)
    runner.submit(job)
    return job


@router.get("/v1/videos")
async def list_videos(request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None,
                      order: Literal["asc", "desc"] = "desc"):
    runner = _runner(request)
    try:
        jobs, has_more = runner.store.list(limit=limit, after=after, order=order)
    except KeyError:
        raise APIError(400, f"after: video '{after}' not found", param="after", code="invalid_value") from None
    data = [job.to_object() for job in jobs]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


@router.get("/v1/videos/{video_id}")
async def retrieve_video(video_id: str, request: Request):
    job = _job(_runner(request), video_id)
    headers = {} if job.status in (COMPLETED, "failed") else {"openai-poll-after-ms": str(POLL_AFTER_MS)}
    return JSONResponse(job.to_object(), headers=headers)


@router.get("/v1/videos/{video_id}/content")
async def download_video(video_id: str, request: Request,
                         variant: Literal["video", "thumbnail", "spritesheet"] = "video"):
    runner = _runner(request)
    job = _job(runner, video_id)
    if job.status != COMPLETED:
        raise APIError(400, f"video '{video_id}' is {job.status}; its content exists once it is completed",
                       param="video_id", code="video_not_ready")
    file = _content(runner, video_id, variant)
    if file is None:
        raise APIError(404, f"the {variant} of video '{video_id}' is gone", code="content_not_found")
    return file


def _content(runner: VideoRunner, video_id: str, variant: str, headers: dict | None = None):
    """The response of a video's `variant` file (video, thumbnail, spritesheet), None when the file is gone."""
    path = runner.store.job_dir(video_id) / encoding.FILE_NAMES[variant]
    if not path.exists():
        return None
    return _VideoFile(path, media_type=encoding.CONTENT_TYPES[variant], content_disposition_type="inline",
                      filename=f"{video_id}{path.suffix}", headers=headers)


class _VideoFile(FileResponse):
    """Starlette's FileResponse (byte ranges, as players and download managers ask), whose range errors keep the
    API's shape: a malformed `Range` is ignored (RFC 9110 allows it: the whole file, 200) where Starlette answered
    a plain-text 400, and one outside the file is a 416 in the error envelope with `Content-Range: bytes */size`
    where Starlette's had an empty body."""

    async def __call__(self, scope, receive, send):
        http_range = Headers(scope=scope).get("range")
        if http_range is not None:
            size = os.stat(self.path).st_size
            try:
                self._parse_range_header(http_range, size)
            except MalformedRangeHeader:
                scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"range"]}
            except RangeNotSatisfiable:
                error = APIError(416, f"Range {http_range!r} is outside the file's {size} bytes",
                                 param="range", code="range_not_satisfiable", headers={"content-range": f"bytes */{size}"})
                return await error.response()(scope, receive, send)
        await super().__call__(scope, receive, send)


@router.delete("/v1/videos/{video_id}")
async def delete_video(video_id: str, request: Request):
    runner = _runner(request)
    _job(runner, video_id)
    await runner.cancel(video_id)
    runner.store.delete(video_id)
    return {"id": video_id, "object": "video.deleted", "deleted": True}
