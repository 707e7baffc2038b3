"""POST /v1/audio/transcriptions (multipart) for transcription pipelines (e.g. `asr` -> voice_asr).

Triton contract of the ASR model (stateless, dynamic batching, max_batch_size > 0):
  AUDIO   FP32 [1, samples]  mono 16 kHz PCM
  OPTIONS BYTES [1, 1]       JSON {"language": str|null, "prompt": str|null, "temperature": float,
                             "word_timestamps": bool}
  RESULT  BYTES [1, 1]       JSON {"text", "language", "duration" (s), "segments": [{"id", "seek", "start",
                             "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio",
                             "no_speech_prob"}] (OpenAI's TranscriptionSegment), "words": [{"word", "start", "end"}]}
`stream=true` goes to the pipeline's decoupled `stream_entry` (voice_asr_stream: REQUEST = the OPTIONS
JSON, INPUT_AUDIO FP32 [samples]; events `transcript.delta` per segment as it is decoded, then `done`
with the RESULT fields) and becomes SSE: `transcript.text.delta` events whose deltas concatenate to the
text, one `transcript.text.done` with the text and usage, then `data: [DONE]`. Those events carry text only,
so a streamed request takes `response_format` json or text (the same events for both) and any other format
is a 400 (see `transcriptions`).
"""
from __future__ import annotations

import functools
import json

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile  # what request.form() returns (fastapi.UploadFile subclasses it)

from omni_frontend import admission, observability
from omni_frontend import audio as audio_codec
from omni_frontend import pipeline_stream
from omni_frontend.errors import APIError, bad_request
from omni_frontend.pipeline_stream import until_disconnect
from omni_frontend.pipelines import TRANSCRIPTION, Pipeline
from omni_frontend.routes.common import config, form_bool, pipeline_for, single_part, triton
from omni_frontend.validation import LANGUAGE_CODE, read_form

router = APIRouter()
_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
# Formats a streamed answer can carry: its events (TranscriptionTextDeltaEvent / TranscriptionTextDoneEvent)
# hold text and usage, no segment timings, language or words.
_STREAMED_FORMATS = ("json", "text")
MIN_AUDIO_S = 0.1   # shorter files are a 400 audio_too_short, as at OpenAI ("Minimum audio length is 0.1 seconds")


def _timestamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def subtitles(segments: list[dict], fmt: str) -> str:
    """SRT (1-based cues, `,` before ms) or WebVTT (`WEBVTT` header, `.` before ms) text."""
    sep = "," if fmt == "srt" else "."
    cues = []
    for i, seg in enumerate(segments, 1):
        span = f"{_timestamp(seg['start'], sep)} --> {_timestamp(seg['end'], sep)}"
        cues.append(f"{i}\n{span}\n{seg['text'].strip()}\n" if fmt == "srt" else f"{span}\n{seg['text'].strip()}\n")
    return ("WEBVTT\n\n" if fmt == "vtt" else "") + "\n".join(cues)


def _float(value: str | None, name: str, default: float) -> float:
    if value in (None, ""):
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise bad_request(f"{name} must be a number", param=name) from exc


# Multipart fields that would change the answer's contract and that the ASR pipeline does not honour
# (OpenAI's transcription fields): a request that sets them gets 400 naming the field.
_UNSUPPORTED = {"include": "log probabilities are not returned",
                "known_speaker_names": "speaker diarization is not supported",
                "known_speaker_references": "speaker diarization is not supported",
                "keywords": "keyword biasing is not supported (use prompt)",
                "languages": "language sets are not supported (use language)"}

# The multipart body as OpenAPI describes it (the route parses the form itself, within the limits).
_FORM_SCHEMA = {"type": "object", "required": ["file"], "properties": {
    "file": {"type": "string", "format": "binary", "description": "audio file (wav, mp3, flac, ogg, webm, m4a, ...)"},
    "model": {"type": "string"},
    "language": {"type": "string"},
    "prompt": {"type": "string"},
    "response_format": {"type": "string", "enum": list(_FORMATS)},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["word", "segment"]}},
    "stream": {"type": "boolean"},
    "chunking_strategy": {"type": "string", "enum": ["auto"]}}}


# The route's fields: those of _FORM_SCHEMA and _UNSUPPORTED, by the name a multipart key carries before any
# "[": the openai SDK sends a list as `name[]` (`timestamp_granularities[]`, `include[]`) and an object as
# `name[key]` (`chunking_strategy[type]`).
_FIELDS = tuple(sorted({name.removesuffix("[]") for name in _FORM_SCHEMA["properties"]} | set(_UNSUPPORTED)))


def _form_values(form, name: str) -> list:
    return [v for v in form.getlist(name) + form.getlist(f"{name}[]") if v not in ("", None)]


def _check_fields(form) -> None:
    """Raises APIError 400 (code `unsupported_parameter`) naming the first multipart field outside _FIELDS (an unread
    field such as the typo `timestamp_granularity` used to be ignored), a set _UNSUPPORTED field, or a
    `chunking_strategy` other than "auto" (also its object form `chunking_strategy[type]`, ...)."""
    for key in form.keys():
        name = key.partition("[")[0]
        if name not in _FIELDS:
            raise bad_request(f"{name} is not a request field of POST /v1/audio/transcriptions (its fields: "
                              f"{', '.join(_FIELDS)})", param=name, code="unsupported_parameter")
    for name, why in _UNSUPPORTED.items():
        if _form_values(form, name):
            raise bad_request(f"{name} is not supported: {why}", param=name, code="unsupported_parameter")
    if form.get("chunking_strategy") not in (None, "", "auto") or any(k.startswith("chunking_strategy[") for k in form):
        raise bad_request("chunking_strategy: only 'auto' is supported (the audio is transcribed whole, "
                          "segmented by the model)", param="chunking_strategy", code="unsupported_parameter")


@router.post("/v1/audio/transcriptions", openapi_extra={"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": _FORM_SCHEMA}}}})
async def transcriptions(request: Request):
    """Transcribes the multipart `file` (fields in _FORM_SCHEMA) with a transcription pipeline.

    Not streamed: `json` -> {"text", "usage"}; `text` -> the text (text/plain); `srt` / `vtt` -> subtitles
    (text/plain) of the segments; `verbose_json` -> {"task", "language", "duration" (s), "text", "segments",
    "usage"} plus "words" when `timestamp_granularities[]` has "word". `stream=true` -> SSE (`_streamed`).
    Streaming takes `response_format` json or text only, as OpenAI's streaming transcription models do
    (gpt-4o-transcribe: json; gpt-4o-transcribe-diarize: json, text, diarized_json; none streams srt, vtt or
    verbose_json): the events carry text, not the segments, language or duration those formats need, so
    `stream=true` with srt, vtt or verbose_json is a 400 naming `response_format` (code `unsupported_value`)
    before the audio is read. json and text stream the same events. `timestamp_granularities` needs
    `verbose_json` (as at OpenAI), and a multipart field the route does not read or a `chunking_strategy` other
    than "auto" (also the SDK's object form `chunking_strategy[type]`) is a 400 `unsupported_parameter` naming it
    (`_check_fields`). Every bad field is a 400 (413 for a file over the upload limit) naming it, before any
    pipeline work; so is a second `file` part (one file per request, as OpenAI's)."""
    cfg = config(request)
    limits = cfg.limits
    form = await read_form(request, limits.max_upload_bytes + 1)
    upload = single_part(form, "file")
    if not isinstance(upload, UploadFile):
        raise bad_request("multipart field 'file' is required", param="file")
    _check_fields(form)
    fmt = form.get("response_format") or "json"
    if fmt not in _FORMATS:
        raise bad_request(f"response_format must be one of {', '.join(_FORMATS)}", param="response_format")
    stream = form_bool(form.get("stream"), "stream")
    if stream and fmt not in _STREAMED_FORMATS:
        raise bad_request(f"response_format '{fmt}' cannot be streamed: the stream's events carry text only; "
                          f"use {' or '.join(_STREAMED_FORMATS)} with stream=true, or stream=false",
                          param="response_format", code="unsupported_value")
    data = await upload.read(limits.max_upload_bytes + 1)
    if len(data) > limits.max_upload_bytes:
        raise APIError(413, f"file exceeds the {limits.max_upload_bytes} byte limit", param="file", code="file_too_large")
    temperature = _float(form.get("temperature"), "temperature", 0.0)
    if not 0.0 <= temperature <= 1.0:
        raise bad_request("temperature must be in [0, 1]", param="temperature")
    granularities = form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
    if any(g not in ("word", "segment") for g in granularities):
        raise bad_request("timestamp_granularities must be 'word' and/or 'segment'", param="timestamp_granularities")
    if granularities and fmt != "verbose_json":
        raise bad_request(f"timestamp_granularities needs response_format 'verbose_json' (the timings are not in "
                          f"'{fmt}')", param="timestamp_granularities", code="unsupported_parameter")
    language = form.get("language") or None
    if language is not None and not LANGUAGE_CODE.fullmatch(language):
        raise bad_request("language must be an ISO-639-1 code such as 'en'", param="language")
    prompt = form.get("prompt") or None
    if prompt is not None and len(prompt) > limits.max_text_chars:   # tokenized whole by the stage: 8 MB took it ~17 s
        raise bad_request(f"prompt is {len(prompt)} characters; the limit is {limits.max_text_chars} (--max-text-chars)",
                          param="prompt", code="text_too_long")
    pipeline = pipeline_for(request, form.get("model"), TRANSCRIPTION, "transcriptions")
    if stream and pipeline.stream_entry is None:
        raise bad_request(f"model '{pipeline.name}' cannot stream transcriptions", param="stream")
    try:   # decoded before admission: a file that is not audio is a 400 whatever the load
        pcm = await run_in_threadpool(audio_codec.decode, data, 16000, limits.max_audio_seconds)
    except audio_codec.AudioDecodeError as exc:
        raise bad_request(f"file is not decodable audio: {exc}", param="file", code="invalid_audio") from exc
    except audio_codec.AudioTooLong as exc:
        raise bad_request(f"file is longer than {exc.max_seconds:g} s (limit --max-audio-seconds)", param="file",
                          code="audio_too_long") from exc
    if pcm.size < (MIN_AUDIO_S - 0.001) * 16000:   # OpenAI's minimum (a resampled 0.1 s may round a sample short)
        raise bad_request(f"file is {pcm.size / 16000:.3f} s of audio; the minimum is {MIN_AUDIO_S:g} s", param="file",
                          code="audio_too_short")

    options = {"language": language, "prompt": prompt,
               "temperature": temperature, "word_timestamps": "word" in granularities}
    ticket = admission.enter(request, pipeline)
    await until_disconnect(request, ticket.wait(request))
    if stream:
        return await _streamed(request, pipeline, pcm, options)
    inputs = {"AUDIO": pcm[None, :], "OPTIONS": np.array([[json.dumps(options).encode()]], dtype=np.object_)}
    reply = await until_disconnect(request, triton(request).infer(pipeline.entry, inputs, request.state.request_id))
    result = json.loads(reply["RESULT"].reshape(-1)[0])
    usage = _usage(result, pcm)
    observability.timer(request, pipeline.name).done(input_audio_s=pcm.size / 16000)
    if fmt == "json":
        return {"text": result["text"], "usage": usage}
    if fmt == "text":
        return PlainTextResponse(result["text"])
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(subtitles(result.get("segments", []), fmt))
    language = await run_in_threadpool(language_name, result.get("language"))
    verbose = {"task": "transcribe", "language": language, "duration": result.get("duration"),
               "text": result["text"], "segments": result.get("segments", []), "usage": usage}
    if "word" in granularities:
        verbose["words"] = result.get("words", [])
    return verbose


@functools.cache
def _language_names() -> dict[str, str]:
    """Whisper's language names by code ("en" -> "english"), the table of transformers' Whisper tokenizer (imported
    on the first verbose_json answer: ~1 s and ~20 MB the frontend needs for nothing else)."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return dict(LANGUAGES)


def language_name(code: str | None) -> str | None:
    """verbose_json's `language`: OpenAI's whisper-1 gives the language's English name in lower case ("english")
    where the ASR stage reports Whisper's code ("en"); a code Whisper has no name for is passed as it is."""
    return _language_names().get(code, code) if code else code


def _usage(result: dict, pcm: np.ndarray) -> dict:
    return {"type": "duration", "seconds": round(float(result.get("duration", pcm.size / 16000)), 3)}


async def _streamed(request: Request, pipeline: Pipeline, pcm: np.ndarray, options: dict) -> EventSourceResponse:
    """SSE of the pipeline's streaming model (`pipeline.stream_entry`, checked by `transcriptions`): a delta per
    segment as Whisper finishes it, done, [DONE]."""
    request_id = request.state.request_id
    events = pipeline_stream.events(triton(request), pipeline.stream_entry, options, request_id,
                                    {"INPUT_AUDIO": pcm})
    first = await until_disconnect(request, anext(events, None))  # fail before the 200 head

    async def sse():
        try:
            async for event, _ in pipeline_stream.prepend(first, events):
                if event.get("type") == "transcript.delta":
                    yield json.dumps({"type": "transcript.text.delta", "delta": event["delta"]})
                elif event.get("type") == "done":
                    yield json.dumps({"type": "transcript.text.done", "text": event["text"],
                                      "usage": _usage(event, pcm)})
            observability.timer(request, pipeline.name).done(input_audio_s=pcm.size / 16000)
            yield "[DONE]"
        except Exception as exc:  # noqa: BLE001 - a mid-stream failure becomes an error event, then the stream ends
            yield json.dumps((exc if isinstance(exc, APIError) else APIError(500, f"internal error: {exc}")).body())
        finally:
            await events.aclose()

    return EventSourceResponse(sse(), ping=15, headers={"x-request-id": request_id})
