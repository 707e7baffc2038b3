"""Items of one HTTP request run as concurrent pipeline requests (the batch routes: /v1/audio/speech/batch,
/v1/chat/completions/batch), within the pipeline's admission bounds.

The HTTP request holds one admission ticket (`admission.enter`, awaited by the route: the batch queues and is
refused as one request). `run_items` also takes up to CONCURRENCY - 1 slots that are free when it starts, runs the
items on all the slots it holds, and gives an extra slot back after its current item as soon as another request
queues, so a batch speeds up on an idle server without holding others back.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from omni_frontend.admission import Gate

T = TypeVar("T")
CONCURRENCY = 8    # items run at once at most (vLLM-Omni's tts_batch_concurrency default)


async def run_items(gate: Gate, count: int, run: Callable[[int], Awaitable[T]]) -> list[T]:
    """[await run(0), ..., await run(count - 1)], the calls spread over the caller's slot of `gate` and the extra
    slots described in the module doc (all given back when this returns or is cancelled). A call's exception
    cancels the others and propagates."""
    results: list[T | None] = [None] * count
    pending = list(range(count))

    async def worker(ticket) -> None:
        try:
            while pending:
                index = pending.pop(0)
                results[index] = await run(index)
                if ticket is not None and gate.waiting:   # another request waits: give it this slot
                    return
        finally:
            if ticket is not None:
                ticket.release()

    extra = []
    while len(extra) < min(CONCURRENCY, count) - 1 and (ticket := gate.try_enter()) is not None:
        extra.append(ticket)
    tasks = [asyncio.ensure_future(worker(ticket)) for ticket in (None, *extra)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for ticket in extra:
            ticket.release()
    return results
