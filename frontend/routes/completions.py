"""POST /v1/completions (OpenAI's legacy completions, vLLM's field set) for chat pipelines: text out.

Each prompt (completions_protocol.prompts) is one pipeline request whose prompt reaches the LLM without the chat
template; several prompts run concurrently on the request's admission slot and the gate's free ones
(generation.merged) and answer one choice each (`index`: the prompt's position). Non-streamed: one text_completion
{"id": "cmpl-<request id>", "object", "created", "model", "choices": [{"index", "text", "logprobs": null,
"finish_reason"}], "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}} (usage summed over the
prompts). Streamed: SSE text_completion chunks, each with one choice's new text (`echo`: the prompt first), a
chunk with its finish_reason when it ends, with `stream_options.include_usage` a last chunk with no choice and the
usage, then `data: [DONE]`; a failure after the head is an error envelope event.
"""
from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, generation, observability, pipeline_stream
from omni_frontend.chat_protocol import ROUTED_KEYS, extensions
from omni_frontend.completions_protocol import CompletionRequest, to_pipeline
from omni_frontend.errors import APIError
from omni_frontend.observability import RequestTimer
from omni_frontend.pipelines import CHAT, Pipeline
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields, triton
from omni_frontend.routes.tokenize import not_tokenizing

router = APIRouter()
ROUTE = "/v1/completions"


class Choices:
    """Accumulates the events of a completion's prompts (choice i answers prompt i) into OpenAI text_completion
    objects and feeds the request's RequestTimer. `echoes`: each choice's text before its answer (its prompt with
    `echo`, else "")."""

    def __init__(self, req: CompletionRequest, request_id: str, echoes: list[str], timer: RequestTimer):
        self.req, self.id, self.timer = req, f"cmpl-{request_id}", timer
        self.created = int(time.time())
        self.echoes = echoes
        self.texts: list[list[str]] = [[echo] for echo in echoes]
        self.finish_reasons: list[str | None] = [None] * len(echoes)
        self.usages: list[dict] = [{} for _ in echoes]

    def absorb(self, index: int, event: dict, _audio=None) -> None:
        kind = event.get("type")
        if kind == "text.delta" and event.get("text"):
            self.texts[index].append(event["text"])
            self.timer.text()
        elif kind == "done":
            self.finish_reasons[index] = event.get("finish_reason", "stop")
            self.usages[index] = event.get("usage") or {}

    @staticmethod
    def choice(index: int, text: str, finish_reason: str | None = None) -> dict:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def usage(self) -> dict:
        """Token counts summed over the prompts (the pipelines' LLM counts)."""
        prompt = sum(u.get("prompt_tokens", 0) for u in self.usages)
        completion = sum(u.get("completion_tokens", 0) for u in self.usages)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def wire(self, choices: list[dict], usage: dict | None = None) -> dict:
        """A text_completion object (a whole answer or one stream chunk) with `choices`."""
        body = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.req.model,
                "system_fingerprint": None, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    def response(self) -> dict:
        return self.wire([self.choice(i, "".join(text), self.finish_reasons[i]) for i, text in enumerate(self.texts)],
                         self.usage())


async def _echoes(request: Request, pipeline: Pipeline, req: CompletionRequest, bodies: list[dict]) -> list[str]:
    """Each choice's echo: its prompt's text (token ids as the pipeline's tokenizer decodes them) with `echo`, else
    "". Raises APIError (400 naming `prompt` for a token id outside the vocabulary)."""
    if not req.echo:
        return [""] * len(bodies)
    echoes = []
    for body in bodies:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            try:
                answer = await pipeline_stream.detokenize(triton(request), pipeline.entry, request.state.request_id,
                                                          prompt)
            except APIError as exc:
                exc.param = "prompt" if exc.param == "tokens" else exc.param
                raise
            if answer is None:
                raise not_tokenizing(pipeline, "echo of token ids")
            prompt = answer["text"]
        echoes.append(prompt)
    return echoes


async def _prompt_events(request: Request, pipeline: Pipeline, bodies: list[dict], index: int, request_id: str):
    """generation.events of prompt `index`; with several prompts an error's message names its prompt."""
    rid = request_id if len(bodies) == 1 else f"{request_id}-{index}"
    try:
        async for item in generation.events(request, pipeline, bodies[index], rid):
            yield item
    except APIError as exc:
        if len(bodies) > 1:
            exc.message = f"prompt {index}: {exc.message}"
        raise


@router.post(ROUTE)
async def create_completion(req: CompletionRequest, request: Request):
    """Validation and the pipeline's check of extension fields first (a 400 naming the field), then admission (429
    at once when the pipeline is full), then the pipeline; a streamed request waits for its slot and the first
    event before its head, as /v1/chat/completions does."""
    cfg = config(request)
    pipeline = pipeline_for(request, req.model, CHAT, "completions")
    await refuse_unread_fields(request, pipeline, ROUTE, extensions(req), CompletionRequest.model_fields, ROUTED_KEYS)
    bodies = await run_in_threadpool(to_pipeline, req, cfg.limits)
    echoes = await _echoes(request, pipeline, req, bodies)
    ticket = admission.enter(request, pipeline)
    request_id = request.state.request_id
    choices = Choices(req, request_id, echoes, observability.timer(request, pipeline.name))
    stream = generation.merged(ticket, len(bodies), lambda i: _prompt_events(request, pipeline, bodies, i, request_id))

    if not req.stream:
        async def finish():
            choices.timer.done()
            return choices.response()
        return await generation.collect(request, ticket, stream, choices.absorb, finish)

    events = await generation.opened(request, ticket, stream)   # a rejection: before the head
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def produce():
        if any(echoes):
            yield json.dumps(choices.wire([choices.choice(i, echo) for i, echo in enumerate(echoes)]))
        async for index, event, audio in events:
            choices.absorb(index, event, audio)
            if event.get("type") == "text.delta" and event.get("text"):
                yield json.dumps(choices.wire([choices.choice(index, event["text"])]))
            elif event.get("type") == "done":
                yield json.dumps(choices.wire([choices.choice(index, "", choices.finish_reasons[index])]))
        choices.timer.done()
        if include_usage:
            yield json.dumps(choices.wire([], choices.usage()))
        yield "[DONE]"

    return generation.sse_response(request, ROUTE, request_id, produce(), lambda err: json.dumps(err.body()), stream)
