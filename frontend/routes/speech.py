"""POST /v1/audio/speech for speech pipelines (e.g. `tts`) and GET /v1/audio/voices for every
pipeline that speaks (speech and chat pipelines).

Speech pipeline REQUEST JSON: {"input": str, "voice": str, "speed": float} + the request's unknown fields, which
the route refuses before admission unless the pipeline reads them (400 `unsupported_parameter` naming the field;
routes.common.refuse_unread_fields), as the pipeline itself does for direct Triton clients -> events
{"type": "audio.delta", "sample_rate"} + AUDIO float32, then {"type": "done", "usage":
{"input_tokens", "output_tokens", "total_tokens"}}. Any speaking pipeline (speech or chat) answers
{"action": "voices"} with one event {"type": "voices", "voices": [str], "default": str}; with a "voice"
added it first checks that name as a request's voice (a 400 naming `voice` if unknown) and the event
adds "voice": the name it resolves to (omni_frontend.pipeline_stream.voices).

Bodies: `pcm` streams raw PCM16 as each chunk is spoken; `wav` and the compressed formats are whole files
sent when the speech is complete (a WAV file carries its real RIFF/data sizes); `stream_format: "sse"`
streams base64 deltas (for wav: a streaming WAV whose first delta holds a header with 0xFFFFFFFF sizes).
"""
from __future__ import annotations

import base64
import json
from typing import Literal

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ConfigDict, Field
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, observability, pipeline_stream
from omni_frontend import audio as audio_codec
from omni_frontend.errors import APIError, bad_request
from omni_frontend.observability import RequestTimer
from omni_frontend.pipelines import CHAT, SPEECH
from omni_frontend.chat_protocol import Voice
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields, triton
from omni_frontend.validation import RequestModel

router = APIRouter()
ROUTED_KEYS = ("input", "voice", "speed")   # the speech REQUEST keys the route fills (refuse_unread_fields)


class SpeechRequest(RequestModel):
    model_config = ConfigDict(extra="allow", strict=True)
    input: str
    model: str | None = None
    voice: Voice
    instructions: str | None = Field(default=None, description="not supported (Kokoro takes no instructions): "
                                                               "only null or empty")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"


def validate(req: SpeechRequest, limits) -> None:
    """Raises APIError 400 naming the field for an empty or too long `input`, `instructions`, or SSE in a format
    that cannot stream."""
    if not req.input.strip():
        raise bad_request("input must not be empty", param="input", code="empty_input")
    if len(req.input) > limits.max_speech_input_chars:
        raise bad_request(f"input is {len(req.input)} characters; the limit is {limits.max_speech_input_chars}",
                          param="input", code="input_too_long")
    if req.instructions:
        raise bad_request("instructions are not supported: the speech models take no style instructions",
                          param="instructions", code="unsupported_parameter")
    if req.stream_format == "sse" and req.response_format not in audio_codec.STREAMABLE:
        raise bad_request("stream_format 'sse' needs response_format 'pcm' or 'wav'", param="response_format")


@router.post("/v1/audio/speech")
async def speech(req: SpeechRequest, request: Request):
    """Extension fields the pipeline does not read first (a 400 naming the field, whatever the load), then
    admission (429 at once when the pipeline is full), then the pipeline. Every request waits for its slot
    and the pipeline's first event before its head, so a rejection (or a queue wait past --max-queue-wait)
    is an HTTP status whatever the load."""
    cfg = config(request)
    validate(req, cfg.limits)
    pipeline = pipeline_for(request, req.model, SPEECH, "speech")
    extra = pipeline_stream.extension_fields(req.model_extra)
    await refuse_unread_fields(request, pipeline, "/v1/audio/speech", extra, SpeechRequest.model_fields, ROUTED_KEYS)
    ticket = admission.enter(request, pipeline)
    body = {**extra, "input": req.input, "voice": req.voice, "speed": req.speed}
    request_id = request.state.request_id
    timer = observability.timer(request, pipeline.name)
    stream = pipeline_stream.events(triton(request), pipeline.entry, body, request_id)
    media_type = audio_codec.CONTENT_TYPES[req.response_format]
    headers = {"x-request-id": request_id}
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    # Fail before the 200 head when the pipeline rejects the request.
    first = await pipeline_stream.until_disconnect(request, anext(stream, None))
    events = pipeline_stream.prepend(first, stream)

    if req.stream_format == "sse":
        return EventSourceResponse(_sse(req, events, timer), ping=15, headers=headers)
    if req.response_format == "pcm":  # raw PCM goes out as it is made; a WAV file states its sizes, so it waits
        return pipeline_stream.ClosingStreamingResponse(_raw_stream(req, events, timer), media_type=media_type,
                                                        headers=headers)

    pcm, rate, _ = await pipeline_stream.until_disconnect(request, collect(events, timer))
    timer.done()
    data = await run_in_threadpool(audio_codec.encode, pcm, rate, req.response_format)
    return Response(data, media_type=media_type, headers=headers)


async def collect(events, timer: RequestTimer) -> tuple[np.ndarray, int, dict | None]:
    """The whole speech of a pipeline stream: (float32 PCM [samples], sample rate in Hz, the done event's usage or
    None); each chunk is counted in `timer`'s audio. Raises the stream's APIError."""
    pcm, rate, usage = [], 24000, None
    async for event, audio in events:
        if event.get("type") == "audio.delta" and audio is not None:
            pcm.append(audio)
            rate = int(event.get("sample_rate", rate))
            timer.audio(audio.size / rate)
        elif event.get("type") == "done":
            usage = event.get("usage")
    return (np.concatenate(pcm) if pcm else np.zeros(0, np.float32)), rate, usage


def stream_encoder(response_format: str):
    """Per-chunk bytes of a stream in `response_format` ("pcm" or "wav"): a function (float32 PCM, rate) -> raw PCM16,
    with one streaming WAV header (sizes 0xFFFFFFFF) before the first chunk for wav."""
    state = {"header": response_format != "wav"}

    def encode(audio: np.ndarray, rate: int) -> bytes:
        data = audio_codec.pcm16(audio)
        if not state["header"]:
            state["header"] = True
            data = audio_codec.streaming_wav_header(rate) + data
        return data

    return encode


async def _raw_stream(req: SpeechRequest, events, timer: RequestTimer):
    encode = stream_encoder(req.response_format)
    async for event, audio in events:
        if event.get("type") == "audio.delta" and audio is not None:
            rate = int(event.get("sample_rate", 24000))
            timer.audio(audio.size / rate)
            yield encode(audio, rate)
    timer.done()


async def _sse(req: SpeechRequest, events, timer: RequestTimer):
    encode = stream_encoder(req.response_format)
    usage = None
    try:
        async for event, audio in events:
            if event.get("type") == "audio.delta" and audio is not None:
                rate = int(event.get("sample_rate", 24000))
                timer.audio(audio.size / rate)
                data = encode(audio, rate)
                yield json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            elif event.get("type") == "done":
                usage = event.get("usage")
        timer.done()
        yield json.dumps({"type": "speech.audio.done", "usage": usage or {}})
    except APIError as exc:
        yield json.dumps({"type": "error", **exc.body()})


@router.get("/v1/audio/voices")
async def voices(request: Request, model: str | None = None):
    """The voices of every loaded pipeline that speaks (speech pipelines, and chat pipelines, whose
    `audio.voice` takes them), or of the one `model` names: {"object": "list", "voices": [{"id",
    "model"}], "default": {model: id}}. 404 when `model` names no loaded pipeline with voices, 503
    `pipeline_sleeping` when it names a sleeping one; sleeping pipelines are left out of the full list."""
    listed, defaults = [], {}
    for p in config(request).pipelines:
        if p.kind not in (SPEECH, CHAT) or (model and model not in (p.name, *p.aliases)):
            continue
        if p.name in request.app.state.control.sleeping:  # its models are unloaded: 503 when named, else skipped
            if model:
                request.app.state.control.check(p)
            continue
        try:
            event = await pipeline_stream.voices(triton(request), p.entry, request.state.request_id)
        except APIError as exc:
            if exc.status >= 500:
                raise
            event = None  # a custom chat pipeline that does not speak rejects the action: it has no voices
        if event is not None:
            listed += [{"id": v, "model": p.name} for v in event["voices"]]
            defaults[p.name] = event.get("default")
    if model and not defaults:
        raise APIError(404, f"no loaded pipeline named '{model}' has voices", param="model", code="model_not_found")
    return {"object": "list", "voices": listed, "default": defaults}
