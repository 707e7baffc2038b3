"""POST /v1/responses (OpenAI's Responses API) for chat pipelines: text out, non-streamed or SSE.

The request runs as the chat completion `responses_protocol.chat_body` maps it to (same validation, limits,
admission and pipeline), so a Responses answer and a chat answer of the same greedy request have the same text
and usage. Streamed: response.created, response.in_progress, response.output_item.added,
response.content_part.added, response.output_text.delta..., response.output_text.done, response.content_part.done,
response.output_item.done, then response.completed (response.incomplete when cut by max_output_tokens, with
incomplete_details.reason "max_output_tokens"); a failure after the head is a response.failed event. Every event
carries `sequence_number`; SSE `event:` names its type.
"""
from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, observability, pipeline_stream
from omni_frontend.chat_protocol import ROUTED_KEYS, ChatRequest, extensions, to_pipeline
from omni_frontend.errors import APIError, validation_error
from omni_frontend.pipelines import CHAT
from omni_frontend.responses_protocol import ResponseObject, ResponsesRequest, chat_body, responses_params
from omni_frontend.routes.chat import Completion
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields, triton

router = APIRouter()
ROUTE = "/v1/responses"


@router.post(ROUTE)
async def create_response(req: ResponsesRequest, request: Request):
    """Validation, input decoding and the pipeline's check of extension fields first, then admission (429 at
    once when the pipeline is full), then the pipeline; a streamed request waits for its slot and the
    pipeline's first event before its head, as /v1/chat/completions does."""
    cfg = config(request)
    pipeline = pipeline_for(request, req.model, CHAT, "responses")
    fields = chat_body(req)   # its errors name the Responses fields (`max_tokens` is refused as itself)
    with responses_params(req):
        try:
            chat = ChatRequest.model_validate(fields)
        except ValidationError as exc:
            raise validation_error(exc.errors(), f"POST {ROUTE}") from exc
        await refuse_unread_fields(request, pipeline, ROUTE, extensions(chat),
                                   set(ResponsesRequest.model_fields) | set(ChatRequest.model_fields), ROUTED_KEYS)
        body, tensors = await run_in_threadpool(to_pipeline, chat, cfg.limits, pipeline.content)
    ticket = admission.enter(request, pipeline)
    request_id = request.state.request_id
    extra = tensors or None
    completion = Completion(chat, request_id, cfg.audio_expires_s, observability.timer(request, pipeline.name))
    answer = ResponseObject(req, request_id)
    stream = pipeline_stream.events(triton(request), pipeline.entry, body, request_id, extra)

    def finished() -> tuple[str, str]:
        status = "incomplete" if completion.finish_reason == "length" else "completed"
        return status, "".join(completion.text)

    if not req.stream:
        async def collect():
            await ticket.wait(request)
            with responses_params(req):
                async for event, audio in stream:
                    completion.absorb(event, audio)
            completion.timer.done()
            status, text = finished()
            return answer.wire(status, text, completion.usage_dict())
        return await pipeline_stream.until_disconnect(request, collect())

    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    with responses_params(req):   # a rejection: before the head
        first = await pipeline_stream.until_disconnect(request, anext(stream, None))
    started = time.perf_counter()

    def sse(event: dict) -> dict:
        return {"event": event["type"], "data": json.dumps(event)}

    async def events():
        try:
            yield sse(answer.event("response.created", response=answer.wire("in_progress")))
            yield sse(answer.event("response.in_progress", response=answer.wire("in_progress")))
            yield sse(answer.event("response.output_item.added", output_index=0, item=answer.item("", "in_progress")))
            yield sse(answer.event("response.content_part.added", **answer.at(content_index=0, part=answer.part(""))))
            async for event, audio in pipeline_stream.prepend(first, stream):
                completion.absorb(event, audio)
                if event.get("type") == "text.delta" and event.get("text"):
                    yield sse(answer.event("response.output_text.delta",
                                           **answer.at(content_index=0, delta=event["text"], logprobs=[])))
            completion.timer.done()
            status, text = finished()
            yield sse(answer.event("response.output_text.done", **answer.at(content_index=0, text=text, logprobs=[])))
            yield sse(answer.event("response.content_part.done", **answer.at(content_index=0, part=answer.part(text))))
            yield sse(answer.event("response.output_item.done", output_index=0,
                                   item=answer.item(text, "incomplete" if status == "incomplete" else "completed")))
            yield sse(answer.event(f"response.{status}", response=answer.wire(status, text, completion.usage_dict())))
        except Exception as exc:  # noqa: BLE001 - mid-stream failures end the stream with response.failed
            err = exc if isinstance(exc, APIError) else APIError(500, f"internal error: {exc}")
            yield sse(answer.event("response.failed", response=answer.wire("failed", "".join(completion.text),
                                                                           error=err)))
        finally:
            await stream.aclose()
            request.app.state.metrics.stream.labels(ROUTE).observe(time.perf_counter() - started)

    return EventSourceResponse(events(), ping=15, headers={"x-request-id": request_id})
