"""Fan-in for orchestrators: several producer coroutines (e.g. think / talk / vocode) emit
`(event, audio)` items into one stream that the request coroutine yields in arrival order."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable

_END = object()


class FanIn:
    """`spawn(work)` starts a producer; producers call `put_nowait(item)` / `await put(item)`;
    `async for item in fan` yields items until every producer ended, re-raising the first producer
    exception; `close()` cancels the producers that are still running (always call it)."""

    def __init__(self):
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []

    def spawn(self, work: Awaitable) -> None:
        async def run():
            try:
                await work
            except Exception as exc:  # noqa: BLE001 - re-raised to the consumer
                self._queue.put_nowait(exc)
            finally:
                self._queue.put_nowait(_END)
        self._tasks.append(asyncio.create_task(run()))

    def put_nowait(self, item) -> None:
        self._queue.put_nowait(item)

    async def put(self, item) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self):
        running = len(self._tasks)
        while running:
            item = await self._queue.get()
            if item is _END:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
