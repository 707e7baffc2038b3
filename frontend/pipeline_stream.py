"""Calls a client-facing pipeline model and yields its events (see omni_backends.serving.events:
REQUEST bytes in; EVENT JSON + AUDIO float32 (or IMAGE uint8) out per response), with the client's disconnect
cancelling the Triton request."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import numpy as np
from fastapi import Request
from starlette.responses import StreamingResponse

from omni_frontend.errors import APIError
from omni_frontend.observability import CLIENT_CLOSED
from omni_frontend.triton_client import TritonClient

DISCONNECT_POLL_S = 0.1
# Keys of the pipeline REQUEST protocol that ask a pipeline for something other than serving the request
# ({"action": "voices"}, {"action": "fields"}, {"action": "describe"}): a client's extension fields never carry them.
CONTROL_FIELDS = ("action",)


def extension_fields(extra: dict | None) -> dict:
    """A request's extension fields (pydantic `model_extra`), to pass on in the pipeline REQUEST. Raises
    APIError 400 (code `unsupported_parameter`) naming a CONTROL_FIELDS key: passed on, `"action": "voices"`
    turned a speech request into a voices listing, answered 200 with no audio."""
    extra = dict(extra or {})
    for name in CONTROL_FIELDS:
        if name in extra:
            raise APIError(400, f"{name} is not a request field of this API", param=name, code="unsupported_parameter")
    return extra


async def events(client: TritonClient, model: str, body: dict, request_id: str,
                 extra_inputs: dict[str, np.ndarray] | None = None,
                 payload: str = "AUDIO") -> AsyncIterator[tuple[dict, np.ndarray | None]]:
    """Yields (event, payload) pairs; the payload output (default AUDIO: float32 [samples]; IMAGE for image
    pipelines) is None when empty. Raises APIError on failure."""
    inputs = {"REQUEST": np.array([json.dumps(body).encode()], dtype=np.object_), **(extra_inputs or {})}
    async for response in client.stream(model, inputs, request_id=request_id):
        raw = response.outputs.get("EVENT")
        if raw is None:
            continue
        data = response.outputs.get(payload)
        yield json.loads(raw.reshape(-1)[0]), (data if data is not None and data.size else None)


async def voices(client: TritonClient, model: str, request_id: str, voice: str | None = None) -> dict | None:
    """The pipeline's answer to REQUEST {"action": "voices"}: {"type": "voices", "voices": [str], "default": str},
    or None when it answers with no such event (a pipeline that does not speak). With `voice`, the pipeline
    first checks that name as a request's `voice` would be checked, and the event adds "voice": the name it
    resolves to. Raises APIError (400, param "voice", for a voice the pipeline refuses)."""
    body = {"action": "voices"} if voice is None else {"action": "voices", "voice": voice}
    return await _answer(client, model, body, request_id, "voices")


async def prompt_tokens(client: TritonClient, model: str, request_id: str, messages: list[dict] | None,
                        max_tokens: int, **options) -> dict | None:
    """The chat pipeline's answer to REQUEST {"action": "prompt_tokens", "messages", "max_tokens", **options}:
    {"type": "prompt_tokens", "prompt_tokens": int, "context_length": int} (its LLM's token count of `messages`
    and context, in tokens), or None when it answers with no such event. `options` (omni_backends.serving.
    token_actions): `prompt` (text or token ids, without messages: counted without the chat template),
    `add_generation_prompt`, `add_special_tokens`, `return_token_ids` (true: the event adds "token_ids"). Raises
    APIError (400 `context_length_exceeded`, param "messages" (or "prompt") or "max_tokens", when the prompt plus
    max_tokens cannot fit; 400 naming a bad field)."""
    body = {"action": "prompt_tokens", "messages": messages, "max_tokens": max_tokens, **options}
    return await _answer(client, model, body, request_id, "prompt_tokens")


async def detokenize(client: TritonClient, model: str, request_id: str, tokens: list[int]) -> dict | None:
    """The chat pipeline's answer to REQUEST {"action": "detokenize", "tokens"}: {"type": "detokenized", "text"} (its
    LLM tokenizer's text of the ids), or None when it answers with no such event. Raises APIError (400, param
    "tokens", code `invalid_token_id`, for an id outside its vocabulary)."""
    return await _answer(client, model, {"action": "detokenize", "tokens": tokens}, request_id, "detokenized")


async def fields(client: TritonClient, model: str, request_id: str) -> dict | None:
    """The pipeline's answer to REQUEST {"action": "fields"} (omni_backends.serving.events.fields_event):
    {"type": "fields", "fields": [the REQUEST keys it reads], "hints": {field: advice}}, or None when it
    publishes none (no such event, or a 4xx refusal of the action). Raises APIError (5xx) when the pipeline
    cannot answer."""
    try:
        return await _answer(client, model, {"action": "fields"}, request_id, "fields")
    except APIError as exc:
        if exc.status >= 500:
            raise
        return None


async def _answer(client: TritonClient, model: str, body: dict, request_id: str, kind: str) -> dict | None:
    """The last event of type `kind` that `model` answers the control REQUEST `body` with (None if none)."""
    found = None
    async for event, _ in events(client, model, body, request_id):
        if event.get("type") == kind:
            found = event
    return found


async def until_disconnect(request: Request, work):
    """Awaits coroutine `work` unless the HTTP client goes away first; then cancels it (which
    cancels its Triton stream) and raises APIError 499 (client closed request: logged and counted
    as such, not as a server error; nobody is left to read the response)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(CLIENT_CLOSED, "client closed the request", code="client_closed_request")
    finally:
        if not task.done():
            task.cancel()


class ClosingStreamingResponse(StreamingResponse):
    """Starlette's StreamingResponse, except that its body iterator is closed however the response ends: when a
    send fails (e.g. observability.SlowClient, a client that stopped reading) Starlette leaves the generator
    suspended, and the pipeline request it reads ran on until the garbage collector found it."""

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()


async def prepend(first, stream: AsyncIterator):
    """Re-attaches an event taken with `anext(stream, None)` (used to fail before the 200 head)."""
    if first is not None:
        yield first
    async for item in stream:
        yield item
