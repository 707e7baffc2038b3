"""The generation flow the chat pipeline routes share (/v1/chat/completions, /v1/responses, /v1/completions).

Each request, streamed or not, is admitted first (`admission.enter`, awaited here), then reads its pipeline
stream(s) (`events`; several prompts of one completion: `merged`). A non-streamed request is `collect`ed; a
streamed one waits for its slot and its first event before the 200 head (`opened`: a rejection is an HTTP status,
never a 200 whose stream ends in an error), then is sent as SSE (`sse_response`: a failure after the head is the
route's own error event, the pipeline stream is closed however the response ends, and its time goes to the
frontend's stream metric). The client's disconnect cancels the work (APIError 499, pipeline_stream.until_disconnect).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import numpy as np
from fastapi import Request
from sse_starlette.sse import EventSourceResponse

from omni_frontend import batching, pipeline_stream
from omni_frontend.admission import Ticket
from omni_frontend.errors import APIError
from omni_frontend.pipelines import Pipeline
from omni_frontend.routes.common import triton

Item = tuple[dict, np.ndarray | None]   # one pipeline event and its AUDIO (None when empty)


async def events(request: Request, pipeline: Pipeline, body: dict, request_id: str, extra: dict | None = None,
                 field_of_key: Mapping[str, str] | None = None) -> AsyncIterator[Item]:
    """pipeline_stream.events of `pipeline`'s entry model for REQUEST `body` (and extra input tensors), whose
    errors name the route's field: an APIError whose param is a REQUEST key of `field_of_key` gets the field's name
    (chat's `audio.voice` for the key `voice`). Closing it closes the pipeline stream (which cancels its Triton
    request)."""
    try:
        async with contextlib.aclosing(pipeline_stream.events(triton(request), pipeline.entry, body, request_id,
                                                              extra)) as stream:
            async for item in stream:
                yield item
    except APIError as exc:
        exc.param = (field_of_key or {}).get(exc.param, exc.param)
        raise


async def merged(ticket: Ticket, count: int,
                 open_stream: Callable[[int], AsyncIterator[Item]]) -> AsyncIterator[tuple]:
    """(i, event, audio: np.ndarray | None) of `count` pipeline streams (`open_stream(i)`) run concurrently on the
    request's admitted `ticket` and the gate's free slots (`batching.run_items`), in the order their events arrive.
    A stream's failure cancels the others and is raised once the events before it are yielded; closing this cancels
    every stream."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def run(i: int) -> None:
        async with contextlib.aclosing(open_stream(i)) as stream:
            async for event, audio in stream:
                queue.put_nowait((i, event, audio))

    task = asyncio.ensure_future(batching.run_items(ticket, count, run))
    task.add_done_callback(lambda _: queue.put_nowait(end))
    try:
        while (item := await queue.get()) is not end:
            yield item
        task.result()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def collect(request: Request, ticket: Ticket, stream: AsyncIterator, absorb: Callable[..., None],
                  finish: Callable[[], Awaitable]):
    """A non-streamed request's answer: waits for its admission slot, passes every item of `stream` to
    `absorb(*item)`, then returns `await finish()`; the client's disconnect cancels it (APIError 499)."""
    async def run():
        await ticket.wait(request)
        async for item in stream:
            absorb(*item)
        return await finish()
    return await pipeline_stream.until_disconnect(request, run())


async def opened(request: Request, ticket: Ticket, stream: AsyncIterator) -> AsyncIterator:
    """A streamed request's `stream`, once its admission slot and its first item came (both before the 200 head:
    a rejection raises its APIError here); the client's disconnect meanwhile raises APIError 499."""
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    first = await pipeline_stream.until_disconnect(request, anext(stream, None))
    return pipeline_stream.prepend(first, stream)


def sse_response(request: Request, route: str, request_id: str, produce: AsyncIterator,
                 on_error: Callable[[APIError], object], stream: AsyncIterator) -> EventSourceResponse:
    """The SSE response sending each item of `produce` (SSE data, or a dict with "event" and "data"); a failure
    while producing is sent as `on_error(APIError)` (another exception as a 500 APIError), which ends the response.
    However it ends, `stream` (the pipeline stream `produce` reads) is closed and the response's time observed in
    the frontend's stream metric under `route`. Headers: x-request-id; a ping comment every 15 s."""
    started = time.perf_counter()

    async def body():
        try:
            async for item in produce:
                yield item
        except Exception as exc:  # noqa: BLE001 - mid-stream failures become an error event, then the stream ends
            yield on_error(exc if isinstance(exc, APIError) else APIError(500, f"internal error: {exc}"))
        finally:
            await produce.aclose()
            await stream.aclose()
            request.app.state.metrics.stream.labels(route).observe(time.perf_counter() - started)

    return EventSourceResponse(body(), ping=15, headers={"x-request-id": request_id})
