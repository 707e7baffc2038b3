"""Items of one HTTP request run as concurrent pipeline requests (the batch routes: /v1/audio/speech/batch,
/v1/chat/completions/batch), within the pipeline's admission bounds.

The HTTP request holds one admission ticket (`admission.enter`, awaited by the route: the batch queues and is
refused as one request). `run_items` also takes up to CONCURRENCY - 1 slots that are free when it starts, runs the
items on all the slots it holds, and gives an extra slot back after its current item as soon as another request
queues, so a batch speeds up on an idle server without holding others back; between two items its own slot passes
to a waiting request and the batch queues again behind it (`Ticket.take_turn`: a batch runs one item per turn, an
ordinary request waits about one item's run). A realtime session's preemptive
response (`Gate.try_enter`, which never queues) gets no slot while a batch holds them all.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from omni_frontend.admission import Ticket

T = TypeVar("T")
CONCURRENCY = 8    # items run at once at most (vLLM-Omni's tts_batch_concurrency default)


async def run_items(ticket: Ticket, count: int, run: Callable[[int], Awaitable[T]]) -> list[T]:
    """[await run(0), ..., await run(count - 1)], the calls spread over the caller's admitted `ticket` (released by
    the caller, as every request's) and the extra slots of its gate described in the module doc (all given back when
    this returns or is cancelled). The gate's mean run time (behind Retry-After) gets each call's time, not the
    tickets' hold times. A call's exception cancels the others and propagates."""
    gate = ticket.gate
    ticket.timed = False
    results: list[T | None] = [None] * count
    pending = list(range(count))

    async def worker(extra_ticket: Ticket | None) -> None:
        try:
            while pending:
                index = pending.pop(0)
                started = time.perf_counter()
                results[index] = await run(index)
                gate.record_run(time.perf_counter() - started)
                if extra_ticket is not None and gate.waiting:   # another request waits: give it this slot
                    return
                if extra_ticket is None and pending:   # the batch's own slot: its turn passes to a waiting request
                    await ticket.take_turn()
        finally:
            if extra_ticket is not None:
                extra_ticket.release()

    extra = []
    while len(extra) < min(CONCURRENCY, count) - 1 and (more := gate.try_enter()) is not None:
        more.timed = False
        extra.append(more)
    tasks = [asyncio.ensure_future(worker(t)) for t in (None, *extra)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        for t in extra:
            t.release()
    return results
