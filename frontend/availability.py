"""Which Triton models may take requests now, and the requests in flight through each.

A stage whose stub died never answers the requests it held (Triton keeps them pending for good), so
waiting for them means hanging the client until its timeout. When the stage monitor finds a dead
stage it calls `mark_down`: every request in flight whose pipeline routes through that model fails at
once with the given error (503, OpenAI envelope; the frontend closes its Triton stream) and new ones
are refused with it until `mark_up`. `TritonClient` consults this for every call.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from omni_frontend.errors import APIError


class Availability:
    """routes: entry model -> every Triton model a request to it passes through (the pipeline's models);
    an entry that is not listed routes through itself only."""

    def __init__(self, routes: dict[str, Iterable[str]] | None = None):
        self.routes = {entry: tuple(models) for entry, models in (routes or {}).items()}
        self._down: dict[str, APIError] = {}
        self._inflight: dict[str, set[asyncio.Future]] = {}  # entry -> failure futures of its requests

    def route(self, entry: str) -> tuple[str, ...]:
        return self.routes.get(entry, (entry,))

    def down(self) -> dict[str, APIError]:
        """Models marked down now, with the error their requests get."""
        return dict(self._down)

    def check(self, entry: str) -> None:
        """Raises the APIError of the first model of `entry`'s route that is down."""
        for model in self.route(entry):
            if model in self._down:
                raise self._down[model]

    @contextmanager
    def track(self, entry: str) -> Iterator[asyncio.Future]:
        """Registers one request to `entry` for its duration; the yielded future gets the APIError when
        a model of its route is marked down. Raises that error at once if one is down already."""
        self.check(entry)
        failure = asyncio.get_running_loop().create_future()
        self._inflight.setdefault(entry, set()).add(failure)
        try:
            yield failure
        finally:
            self._inflight[entry].discard(failure)
            if not failure.done():
                failure.cancel()

    def mark_down(self, models: Iterable[str], error: APIError) -> int:
        """Refuse requests through `models` with `error` and fail those in flight; returns how many failed."""
        models = set(models)
        for model in models:
            self._down[model] = error
        failed = 0
        for entry, futures in self._inflight.items():
            if models & set(self.route(entry)):
                for failure in futures:
                    if not failure.done():
                        failure.set_result(error)
                        failed += 1
        return failed

    def mark_up(self, models: Iterable[str]) -> None:
        for model in models:
            self._down.pop(model, None)


async def first_of(awaitable, failure: asyncio.Future):
    """The result of `awaitable`, unless `failure` completes first: then `awaitable` is cancelled and the
    APIError in `failure` is raised."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task, failure}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    raise failure.result()
