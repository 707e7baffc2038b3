"""POST /v1/audio/speech and GET /v1/audio/voices for speech pipelines (e.g. `tts`).

Speech pipeline REQUEST JSON: {"input": str, "voice": str, "speed": float, "instructions": str|null}
-> events {"type": "audio.delta", "sample_rate"} + AUDIO float32, then {"type": "done", "usage":
{"input_tokens", "output_tokens", "total_tokens"}}. {"action": "voices"} -> one event
{"type": "voices", "voices": [str], "default": str}.

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
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from omni_frontend import audio as audio_codec
from omni_frontend import pipeline_stream
from omni_frontend.errors import APIError, bad_request
from omni_frontend.pipelines import SPEECH
from omni_frontend.routes.common import config, pipeline_for, triton

router = APIRouter()


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    input: str
    model: str | None = None
    voice: str = Field(min_length=1)
    instructions: str | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"


@router.post("/v1/audio/speech")
async def speech(req: SpeechRequest, request: Request):
    cfg = config(request)
    if not req.input.strip():
        raise bad_request("input must not be empty", param="input", code="empty_input")
    if len(req.input) > cfg.max_speech_input_chars:
        raise bad_request(f"input is {len(req.input)} characters; the limit is {cfg.max_speech_input_chars}",
                          param="input", code="input_too_long")
    if req.stream_format == "sse" and req.response_format not in audio_codec.STREAMABLE:
        raise bad_request("stream_format 'sse' needs response_format 'pcm' or 'wav'", param="response_format")
    pipeline = pipeline_for(request, req.model, SPEECH, "speech")
    body = {**(req.model_extra or {}), "input": req.input, "voice": req.voice, "speed": req.speed, "instructions": req.instructions}
    request_id = request.state.request_id
    stream = pipeline_stream.events(triton(request), pipeline.entry, body, request_id)
    # Fail before the 200 head when the pipeline rejects the request.
    first = await pipeline_stream.until_disconnect(request, anext(stream, None))
    media_type = audio_codec.CONTENT_TYPES[req.response_format]
    headers = {"x-request-id": request_id}

    if req.stream_format == "sse":
        return EventSourceResponse(_sse(req, pipeline_stream.prepend(first, stream)), ping=15, headers=headers)
    if req.response_format == "pcm":  # raw PCM goes out as it is made; a WAV file states its sizes, so it waits
        return StreamingResponse(_raw_stream(req, pipeline_stream.prepend(first, stream)), media_type=media_type, headers=headers)

    async def collect():
        pcm, rate = [], 24000
        async for event, audio in pipeline_stream.prepend(first, stream):
            if event.get("type") == "audio.delta" and audio is not None:
                pcm.append(audio)
                rate = int(event.get("sample_rate", rate))
        return np.concatenate(pcm) if pcm else np.zeros(0, np.float32), rate

    pcm, rate = await pipeline_stream.until_disconnect(request, collect())
    return Response(audio_codec.encode(pcm, rate, req.response_format), media_type=media_type, headers=headers)


def _encoder(req: SpeechRequest):
    """Per-chunk bytes of a stream: raw PCM16, with one streaming WAV header (sizes 0xFFFFFFFF) first for wav."""
    state = {"header": req.response_format != "wav"}

    def encode(audio: np.ndarray, rate: int) -> bytes:
        data = audio_codec.pcm16(audio)
        if not state["header"]:
            state["header"] = True
            data = audio_codec.streaming_wav_header(rate) + data
        return data

    return encode


async def _raw_stream(req: SpeechRequest, events):
    encode = _encoder(req)
    async for event, audio in events:
        if event.get("type") == "audio.delta" and audio is not None:
            yield encode(audio, int(event.get("sample_rate", 24000)))


async def _sse(req: SpeechRequest, events):
    encode = _encoder(req)
    usage = None
    try:
        async for event, audio in events:
            if event.get("type") == "audio.delta" and audio is not None:
                data = encode(audio, int(event.get("sample_rate", 24000)))
                yield json.dumps({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            elif event.get("type") == "done":
                usage = event.get("usage")
        yield json.dumps({"type": "speech.audio.done", "usage": usage or {}})
    except APIError as exc:
        yield json.dumps({"type": "error", **exc.body()})


@router.get("/v1/audio/voices")
async def voices(request: Request, model: str | None = None):
    """The voices of the loaded speech pipeline(s): {"voices": [{"id", "model"}], "default": {model: id}}."""
    listed, defaults = [], {}
    for p in config(request).pipelines:
        if p.kind != SPEECH or (model and model not in (p.name, *p.aliases)):
            continue
        async for event, _ in pipeline_stream.events(triton(request), p.entry, {"action": "voices"},
                                                      request.state.request_id):
            if event.get("type") == "voices":
                listed += [{"id": v, "model": p.name} for v in event["voices"]]
                defaults[p.name] = event.get("default")
    if model and not defaults:
        raise APIError(404, f"speech model '{model}' is not loaded", param="model", code="model_not_found")
    return {"object": "list", "voices": listed, "default": defaults}
