"""POST /v1/audio/speech/batch: up to MAX_ITEMS speech requests in one call (vLLM-Omni's batch speech API).

Body: `items` (1..MAX_ITEMS objects, each a /v1/audio/speech body: `input` required, the other fields optional) plus
batch-level defaults for the items (`model`, `voice`, `response_format` (default wav, as vLLM-Omni's), `speed`, and
the pipeline's extension fields). An item's non-null fields override the defaults; an item's
`model` must name the batch's pipeline. `input` and `stream_format` are not batch fields.

Answer (200 whenever the batch itself was valid): {"id": "speech-batch-<hex>", "results": [one per item, in item
order: {"index", "status": "success", "audio_data": base64 file in the item's format, "media_type", "usage":
{"input_tokens", "output_tokens", "total_tokens"}} or {"index", "status": "error", "error": {"message", "type",
"param", "code"}} (vLLM-Omni's is a string: this is the envelope's error object)], "total", "succeeded", "failed"}. An
item's error names its field as `items[i].<field>` (or the batch-level field it took); a bad item fails alone, also
on an internal error.

Whole-batch errors (the OpenAI envelope): 400 for a malformed body, no items or more than MAX_ITEMS, items whose
inputs together (each divided by its speed) pass BATCH_INPUT_CHARS x --max-speech-input-chars, an item that is not an
object, `instructions`, a batch-level field of the wrong type or not read by the pipeline; 404/400/503 for the model
as /v1/audio/speech; 429 when the pipeline is full. Load: the batch is one request of the pipeline's admission gate;
its items run on that slot and the free ones, one item per turn when others queue (`omni_frontend.batching`). A
client that leaves cancels every item still running in Triton.
"""
from __future__ import annotations

import base64
import uuid
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, batching, observability, pipeline_stream
from omni_frontend import audio as audio_codec
from omni_frontend.chat_protocol import Voice
from omni_frontend.errors import APIError, bad_request, log, validation_error
from omni_frontend.pipelines import SPEECH
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields, triton
from omni_frontend.routes.speech import ROUTED_KEYS, SpeechRequest, collect, validate
from omni_frontend.validation import RequestModel

router = APIRouter()
MAX_ITEMS = 32     # vLLM-Omni's tts_batch_max_items default
BATCH_INPUT_CHARS = 4   # the items' inputs together, each divided by its speed: at most this many times one request's
                        # input limit (the answer holds every file at once: ~20 min of speech at the default limit)


class SpeechBatchRequest(RequestModel):
    model_config = ConfigDict(extra="allow", strict=True)
    items: list[dict] = Field(min_length=1, description=f"1..{MAX_ITEMS} speech requests (`input` required)")
    model: str | None = None
    voice: Voice | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = None


def _spoken_chars(batch: SpeechBatchRequest) -> float:
    """The items' input characters, each divided by its speed (what the answer's size grows with)."""
    total = 0.0
    for item in batch.items:
        speed = item.get("speed")
        speed = speed if isinstance(speed, (int, float)) and 0.25 <= speed <= 4 else batch.speed
        total += len(item["input"]) / speed if isinstance(item.get("input"), str) else 0
    return total


def _item_error(index: int, item: dict, batch_fields: set[str], exc: APIError) -> dict:
    """An item's error result. Its `param` is `items[index].<field>`, or the bare field when the value came from
    the batch (the batch set it, the item did not)."""
    body = exc.body()["error"]
    param = body.get("param")
    if param:
        name = param.split(".")[0].split("[")[0]
        if item.get(name) is not None or name not in batch_fields:
            body["param"] = f"items[{index}].{param}"
    return {"index": index, "status": "error", "error": body}


@router.post("/v1/audio/speech/batch")
async def speech_batch(batch: SpeechBatchRequest, request: Request):
    """Checks the batch (400 for its own fields, before admission), then speaks its items (`batching.run_items`),
    each through the pipeline as one /v1/audio/speech request would go."""
    cfg = config(request)
    if len(batch.items) > MAX_ITEMS:
        raise bad_request(f"items has {len(batch.items)} entries; the limit is {MAX_ITEMS}", param="items",
                          code="too_many_items")
    chars = _spoken_chars(batch)
    if chars > BATCH_INPUT_CHARS * cfg.limits.max_speech_input_chars:
        raise bad_request(f"the items' input has {chars:.0f} characters in all (each divided by its "
                          f"speed); the limit is {BATCH_INPUT_CHARS} x {cfg.limits.max_speech_input_chars} "
                          f"(--max-speech-input-chars)", param="items", code="input_too_long")
    pipeline = pipeline_for(request, batch.model, SPEECH, "speech")
    for name in ("input", "stream_format"):
        if name in (batch.model_extra or {}):
            raise bad_request(f"{name} is not a field of a batch (an item's input goes in its item; the answer is one "
                              f"JSON object)", param=name, code="unsupported_parameter")
    if batch.instructions:
        raise bad_request("instructions are not supported: the speech models take no style instructions",
                          param="instructions", code="unsupported_parameter")
    extensions = pipeline_stream.extension_fields(batch.model_extra)
    defaults = {**extensions, **batch.model_dump(exclude={"items", "model"}, exclude_none=True)}
    batch_fields = {*extensions, *(batch.model_fields_set - {"items", "model"})}
    await refuse_unread_fields(request, pipeline, "/v1/audio/speech/batch", extensions,
                               {*SpeechBatchRequest.model_fields, *SpeechRequest.model_fields}, ROUTED_KEYS)
    ticket = admission.enter(request, pipeline)
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    timer = observability.timer(request, pipeline.name)
    request_id = request.state.request_id

    async def speak(index: int) -> dict:
        item = batch.items[index]
        try:
            if item.get("model") is not None and cfg.pipeline(item["model"]) is not pipeline:
                raise bad_request(f"an item's model must be the batch's ({pipeline.name})", param="model",
                                  code="model_mismatch")
            fields = {**defaults, **{k: v for k, v in item.items() if v is not None and k != "model"}}
            if "stream_format" in fields:
                raise bad_request("stream_format is not a field of a batch item", param="stream_format",
                                  code="unsupported_parameter")
            try:
                req = SpeechRequest.model_validate(fields)
            except ValidationError as exc:
                raise validation_error(exc.errors(), "a batch item") from None
            validate(req, cfg.limits)
            extra = pipeline_stream.extension_fields(req.model_extra)
            await refuse_unread_fields(request, pipeline, "/v1/audio/speech/batch", extra,
                                       SpeechRequest.model_fields, ROUTED_KEYS)
            body = {**extra, "input": req.input, "voice": req.voice, "speed": req.speed}
            events = pipeline_stream.events(triton(request), pipeline.entry, body, f"{request_id}-{index}")
            pcm, rate, usage = await collect(events, timer)
            data = await run_in_threadpool(audio_codec.encode, pcm, rate, req.response_format)
        except APIError as exc:
            return _item_error(index, item, batch_fields, exc)
        except Exception as exc:  # noqa: BLE001 - one item's failure fails that item, never the batch
            log.exception("speech batch %s: item %d failed", request_id, index)
            return _item_error(index, item, batch_fields, APIError(500, f"internal error: {exc}",
                                                                    code="internal_error"))
        return {"index": index, "status": "success", "audio_data": base64.b64encode(data).decode(),
                "media_type": audio_codec.CONTENT_TYPES[req.response_format], "usage": usage or {}}

    results = await pipeline_stream.until_disconnect(request, batching.run_items(ticket, len(batch.items), speak))
    timer.done()
    succeeded = sum(r["status"] == "success" for r in results)
    return {"id": f"speech-batch-{uuid.uuid4().hex}", "results": results, "total": len(results),
            "succeeded": succeeded, "failed": len(results) - succeeded}
