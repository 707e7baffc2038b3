"""POST /v1/audio/speech/batch: up to MAX_ITEMS speech requests in one call (vLLM-Omni's batch speech API).

Body: `items` (1..MAX_ITEMS objects, each a /v1/audio/speech body without `model`: `input` required, the other
fields optional) plus batch-level defaults for the items (`model`, `voice`, `response_format` (default mp3, as
/v1/audio/speech), `speed`, `instructions`, and the pipeline's extension fields). An item's non-null fields override
the defaults. `stream_format` is not a field: the answer is one JSON object.

Answer (200 whenever the batch itself was valid): {"id": "speech-batch-<hex>", "results": [one per item, in item
order: {"index", "status": "success", "audio_data": base64 file in the item's format, "media_type", "usage":
{"input_tokens", "output_tokens", "total_tokens"}} or {"index", "status": "error", "error": {"message", "type",
"param", "code"}}], "total", "succeeded", "failed"}. An item's error names its field as `items[i].<field>` (or the
batch-level field it took); a bad item fails alone.

Whole-batch errors (the OpenAI envelope): 400 for a malformed body, no items or more than MAX_ITEMS, items whose
inputs together pass BATCH_INPUT_CHARS x --max-speech-input-chars, an item that is not an object, a batch-level
field of the wrong type or not read by the pipeline; 404/400/503 for the model as /v1/audio/speech; 429 when the
pipeline is full. Load: the batch is one request of the pipeline's admission gate; its items run on that slot and the
free ones (`omni_frontend.batching`). A client that leaves cancels every item still running in Triton.
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
from omni_frontend.errors import APIError, bad_request
from omni_frontend.pipelines import SPEECH
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields, triton
from omni_frontend.routes.speech import ROUTED_KEYS, SpeechRequest, collect, validate
from omni_frontend.validation import RequestModel

router = APIRouter()
MAX_ITEMS = 32     # vLLM-Omni's tts_batch_max_items default
BATCH_INPUT_CHARS = 4   # the items' inputs together: at most this many times one request's input limit (the answer
                        # holds every file at once: ~20 min of speech at the default limit)


class SpeechBatchRequest(RequestModel):
    model_config = ConfigDict(extra="allow", strict=True)
    items: list[dict] = Field(min_length=1, description=f"1..{MAX_ITEMS} speech requests (`input` required)")
    model: str | None = None
    voice: Voice | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    instructions: str | None = None


def _item_error(index: int, item: dict, exc: APIError) -> dict:
    """An item's error result; its `param` is `items[index].<field>` when the item set that field."""
    body = exc.body()["error"]
    param = body.get("param")
    if param and param.split(".")[0].split("[")[0] in item:
        body["param"] = f"items[{index}].{param}"
    return {"index": index, "status": "error", "error": body}


def _validation_error(exc: ValidationError) -> APIError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"{param} is not a request field of a batch item", param=param,
                        code="unsupported_parameter")
    return bad_request(f"{param}: {first['msg']}" if param else first["msg"], param=param, code="invalid_value")


@router.post("/v1/audio/speech/batch")
async def speech_batch(batch: SpeechBatchRequest, request: Request):
    """Checks the batch (400 for its own fields, before admission), then speaks its items (`batching.run_items`),
    each through the pipeline as one /v1/audio/speech request would go."""
    cfg = config(request)
    if len(batch.items) > MAX_ITEMS:
        raise bad_request(f"items has {len(batch.items)} entries; the limit is {MAX_ITEMS}", param="items",
                          code="too_many_items")
    chars = sum(len(item["input"]) for item in batch.items if isinstance(item.get("input"), str))
    if chars > BATCH_INPUT_CHARS * cfg.limits.max_speech_input_chars:
        raise bad_request(f"the items' input has {chars} characters in all; the limit is {BATCH_INPUT_CHARS} x "
                          f"{cfg.limits.max_speech_input_chars} (--max-speech-input-chars)", param="items",
                          code="input_too_long")
    pipeline = pipeline_for(request, batch.model, SPEECH, "speech")
    if "stream_format" in (batch.model_extra or {}):
        raise bad_request("stream_format is not a field of a batch: its answer is one JSON object",
                          param="stream_format", code="unsupported_parameter")
    defaults = {**pipeline_stream.extension_fields(batch.model_extra),
                **batch.model_dump(exclude={"items", "model"}, exclude_none=True)}
    await refuse_unread_fields(request, pipeline, "/v1/audio/speech/batch", pipeline_stream.extension_fields(
        batch.model_extra), {*SpeechBatchRequest.model_fields, *SpeechRequest.model_fields}, ROUTED_KEYS)
    ticket = admission.enter(request, pipeline)
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    timer = observability.timer(request, pipeline.name)
    request_id = request.state.request_id

    async def speak(index: int) -> dict:
        item = batch.items[index]
        try:
            if item.get("model") not in (None, batch.model, pipeline.name):
                raise bad_request(f"an item's model must be the batch's ({pipeline.name})", param="model",
                                  code="model_mismatch")
            fields = {**defaults, **{k: v for k, v in item.items() if v is not None and k != "model"}}
            if "stream_format" in fields:
                raise bad_request("stream_format is not a field of a batch item", param="stream_format",
                                  code="unsupported_parameter")
            try:
                req = SpeechRequest.model_validate(fields)
            except ValidationError as exc:
                raise _validation_error(exc) from None
            validate(req, cfg.limits)
            extra = pipeline_stream.extension_fields(req.model_extra)
            await refuse_unread_fields(request, pipeline, "/v1/audio/speech/batch", extra,
                                       SpeechRequest.model_fields, ROUTED_KEYS)
            body = {**extra, "input": req.input, "voice": req.voice, "speed": req.speed}
            events = pipeline_stream.events(triton(request), pipeline.entry, body, f"{request_id}-{index}")
            pcm, rate, usage = await collect(events, timer)
            data = await run_in_threadpool(audio_codec.encode, pcm, rate, req.response_format)
        except APIError as exc:
            return _item_error(index, item, exc)
        return {"index": index, "status": "success", "audio_data": base64.b64encode(data).decode(),
                "media_type": audio_codec.CONTENT_TYPES[req.response_format], "usage": usage or {}}

    gate = request.app.state.admission.gate(pipeline.name)
    results = await pipeline_stream.until_disconnect(request, batching.run_items(gate, len(batch.items), speak))
    timer.done()
    succeeded = sum(r["status"] == "success" for r in results)
    return {"id": f"speech-batch-{uuid.uuid4().hex}", "results": results, "total": len(results),
            "succeeded": succeeded, "failed": len(results) - succeeded}
