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

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, generation, observability
from omni_frontend.chat_protocol import ROUTED_KEYS, ChatRequest, extensions, to_pipeline
from omni_frontend.errors import APIError, validation_error
from omni_frontend.pipelines import CHAT
from omni_frontend.responses_protocol import ResponseObject, ResponsesRequest, chat_body, responses_params
from omni_frontend.routes.chat import Completion
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields

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
    stream = generation.events(request, pipeline, body, request_id, extra)

    def finished() -> tuple[str, str]:
        status = "incomplete" if completion.finish_reason == "length" else "completed"
        return status, "".join(completion.text)

    if not req.stream:
        async def finish():
            completion.timer.done()
            status, text = finished()
            return answer.wire(status, text, completion.usage_dict())
        with responses_params(req):
            return await generation.collect(request, ticket, stream, completion.absorb, finish)

    with responses_params(req):   # a rejection: before the head
        events = await generation.opened(request, ticket, stream)

    def sse(event: dict) -> dict:
        return {"event": event["type"], "data": json.dumps(event)}

    async def produce():
        yield sse(answer.event("response.created", response=answer.wire("in_progress")))
        yield sse(answer.event("response.in_progress", response=answer.wire("in_progress")))
        yield sse(answer.event("response.output_item.added", output_index=0, item=answer.item("", "in_progress")))
        yield sse(answer.event("response.content_part.added", **answer.at(content_index=0, part=answer.part(""))))
        async for event, audio in events:
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

    def failed(err: APIError) -> dict:   # a failure after the head ends the stream with response.failed
        return sse(answer.event("response.failed", response=answer.wire("failed", "".join(completion.text), error=err)))

    return generation.sse_response(request, ROUTE, request_id, produce(), failed, stream)
