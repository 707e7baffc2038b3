"""POST /v1/audio/generate for audio-generation pipelines (e.g. `stable_audio`): vLLM-Omni's text-to-audio route,
JSON in, the whole audio file out (Content-Type of `response_format`, header x-seed: the seed used).

Fields (vLLM-Omni's): `input` (required; `prompt` is accepted in its place, not beside it), `model`,
`negative_prompt`, `audio_length` and `audio_start` (seconds; the pipeline bounds them by its checkpoint's longest clip), `num_inference_steps`,
`guidance_scale`, `seed`, `response_format` (wav, pcm, flac, mp3, aac, opus; default wav), `speed` (1.0 only)
and `stream_format` ("audio" only). Audio pipeline REQUEST JSON (omni_backends.stable_audio.serving.audio_model):
{"prompt", "negative_prompt", "audio_start", "audio_length", "num_inference_steps", "guidance_scale", "seed"}
-> events {"type": "progress"} ..., {"type": "audio", "sample_rate", "channels", "seed", ...} + AUDIO float32
[samples, channels]. Every bad input is a 400 naming the field (an unknown field: `unsupported_parameter`), the
types checked here, the ranges that depend on the checkpoint by the pipeline, before the 200 head.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, observability, pipeline_stream
from omni_frontend import audio as audio_codec
from omni_frontend.errors import bad_request
from omni_frontend.pipelines import AUDIO
from omni_frontend.routes.common import pipeline_for, triton
from omni_frontend.validation import RequestModel

router = APIRouter()
MAX_PROMPT_CHARS = 32000


class AudioGenerateRequest(RequestModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    input: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS, description="vLLM-Omni's name for input")
    model: str | None = None
    negative_prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    audio_length: float | None = Field(default=None, gt=0)
    audio_start: float | None = Field(default=None, ge=0)
    num_inference_steps: int | None = Field(default=None, ge=1)
    guidance_scale: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2 ** 63)
    response_format: Literal["wav", "pcm", "flac", "mp3", "aac", "opus"] = "wav"
    speed: float = Field(default=1.0, description="only 1.0: generated audio is not time-stretched")
    stream_format: Literal["audio"] = "audio"


def _text(req: AudioGenerateRequest) -> str:
    """The request's text (`input`, or vLLM-Omni's `prompt`); raises APIError 400 for neither, both or blank."""
    if req.input is not None and req.prompt is not None:
        raise bad_request("input and prompt are one field (prompt is vLLM-Omni's name for input): give one",
                          param="prompt", code="invalid_value")
    text = req.input if req.input is not None else req.prompt
    if text is None:
        raise bad_request("input: Field required", param="input", code="invalid_value")
    if not text.strip():
        raise bad_request("input must not be empty", param="input" if req.input is not None else "prompt",
                          code="empty_input")
    return text


def _check(req: AudioGenerateRequest) -> None:
    if req.speed != 1.0:
        raise bad_request("speed must be 1.0: generated audio is not time-stretched", param="speed",
                          code="unsupported_parameter")


@router.post("/v1/audio/generate")
async def generate(req: AudioGenerateRequest, request: Request):
    """Checks, admission (429 at once when the pipeline is full), then the pipeline; its first event (or its
    400) comes before the head. A client that leaves cancels the pipeline request (its denoising job stops
    before its next step)."""
    text = _text(req)
    _check(req)
    pipeline = pipeline_for(request, req.model, AUDIO, "audio/generate")
    ticket = admission.enter(request, pipeline)
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    fields = {"prompt": text, "negative_prompt": req.negative_prompt, "audio_start": req.audio_start,
              "audio_length": req.audio_length, "num_inference_steps": req.num_inference_steps,
              "guidance_scale": req.guidance_scale, "seed": req.seed}
    request_id = request.state.request_id
    timer = observability.timer(request, pipeline.name)
    stream = pipeline_stream.events(triton(request), pipeline.entry,
                                    {k: v for k, v in fields.items() if v is not None}, request_id)

    async def clip() -> tuple[np.ndarray, dict]:
        found = None
        async for event, audio in stream:   # to the stream's end: the Triton request is then finished
            if event.get("type") == "audio":
                found = audio, event
        if found is None:
            raise RuntimeError(f"{pipeline.entry} ended without an audio event")
        return found

    audio, event = await pipeline_stream.until_disconnect(request, clip())
    timer.audio(event["samples"] / event["sample_rate"])
    timer.done()
    data = await run_in_threadpool(audio_codec.encode, audio, event["sample_rate"], req.response_format)
    return Response(data, media_type=audio_codec.CONTENT_TYPES[req.response_format],
                    headers={"x-request-id": request_id, "x-seed": str(event["seed"])})
