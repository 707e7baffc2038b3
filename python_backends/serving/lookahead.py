"""Ordered lookahead for orchestrators: start the work on the next items (e.g. the TTS of the next text
chunks, on a stage with several instances) while earlier ones are still running, and hand the results
back in item order."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def ordered_map(items: AsyncIterable[T], work: Callable[[T], Awaitable[R]], ahead: int,
                      first_alone: bool = False) -> AsyncIterator[tuple[T, R]]:
    """Yield `(item, await work(item))` in the order of `items`, running `work` on up to `ahead` items
    at once (ahead >= 1; 1: one after the other). first_alone: the second item waits until the first
    one's work ended, so nothing competes with the first result (e.g. the first audio of a reply).

    Items are taken from `items` as they come, so a slow source does not hold back finished work.
    The first exception of a `work` call is raised here (in item order); when the consumer stops early
    or an error is raised, the work still running is cancelled.
    """
    if ahead < 1:
        raise ValueError(f"ahead must be >= 1, got {ahead}")
    started: asyncio.Queue = asyncio.Queue()
    end = object()

    async def launch() -> None:
        running: set[asyncio.Future] = set()
        index = 0
        async for item in items:
            running = {task for task in running if not task.done()}
            while running and (len(running) >= ahead or (first_alone and index == 1)):
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.ensure_future(work(item))
            running.add(task)
            started.put_nowait((item, task))
            index += 1
        started.put_nowait(end)

    launcher = asyncio.ensure_future(launch())
    pending: list[asyncio.Future] = [launcher]
    try:
        while True:
            next_item = asyncio.ensure_future(started.get())
            await asyncio.wait([next_item, launcher], return_when=asyncio.FIRST_COMPLETED)
            if not next_item.done() and launcher.exception() is not None:  # the source raised: raise that
                next_item.cancel()
                raise launcher.exception()
            entry = await next_item
            if entry is end:
                break
            item, task = entry
            pending.append(task)
            yield item, await task
            pending.remove(task)
    finally:
        for task in pending:
            task.cancel()
        while not started.empty():
            entry = started.get_nowait()
            if entry is not end:
                entry[1].cancel()
        await asyncio.gather(*pending, return_exceptions=True)
