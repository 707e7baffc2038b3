"""What the HTTP requests in flight get when the server stops (Ctrl-C or SIGTERM to the launcher).

uvicorn's graceful shutdown waits GRACEFUL_SHUTDOWN_S for the requests in flight, then cancels their tasks: a
request cut that way got uvicorn's plain-text `500 Internal Server Error` (no envelope, no x-request-id), a
CancelledError traceback, and was logged and counted as a client abort (499). Now the launcher tells `Stopping`
when the stop begins (`begin`, safe to call from a signal handler), and every HTTP request runs under its
`cutoff()`: a request still running STOP_GRACE_S later (before uvicorn's own cancel) is stopped there, its pipeline
request cancelled, and `observability.ObservabilityMiddleware` answers it (`stopped_error`): a 503 envelope, code
`server_shutting_down`, with Retry-After, when its response has not started; an SSE error event that ends the
stream when it has (SSE streams in flight are ended at once when the stop begins, by sse_starlette, and get the
same event).
"""
from __future__ import annotations

import asyncio
import contextlib

# uvicorn's timeout_graceful_shutdown (the launcher's): how long requests in flight may take once the stop began
GRACEFUL_SHUTDOWN_S = 5.0
# when the requests still in flight are answered 503: before uvicorn cancels their tasks, leaving time to send it
STOP_GRACE_S = GRACEFUL_SHUTDOWN_S - 0.5
RETRY_AFTER_S = 5


def stopped_error():
    """The APIError of a request that the server's stop cut (503, OpenAI envelope, retryable)."""
    from omni_frontend.errors import APIError   # errors imports observability, which imports this module

    return APIError(503, "the server is shutting down; retry the request", code="server_shutting_down",
                    headers={"retry-after": str(RETRY_AFTER_S), "connection": "close"})


class Stopping:
    """The server's stop as the requests see it. `bind(loop)` at startup; `begin()` when the stop begins."""

    def __init__(self, grace_s: float = STOP_GRACE_S):
        self.grace_s = grace_s
        self.deadline: float | None = None   # loop time after which requests in flight are cut
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cutoffs: set[asyncio.Timeout] = set()

    @property
    def begun(self) -> bool:
        return self.deadline is not None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def begin(self) -> None:
        """The stop began: requests in flight have grace_s more. Safe from a signal handler or another thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        if self.deadline is not None:
            return
        self.deadline = self._loop.time() + self.grace_s
        for cutoff in self._cutoffs:
            cutoff.reschedule(self.deadline)

    @contextlib.asynccontextmanager
    async def cutoff(self):
        """Runs the body until it ends or, once the stop began, until the deadline: then it is cancelled and
        TimeoutError raised here (check `expired()` of the yielded asyncio.Timeout: a TimeoutError of the body's
        own passes through too)."""
        async with asyncio.timeout(self.deadline) as timeout:
            self._cutoffs.add(timeout)
            try:
                yield timeout
            finally:
                self._cutoffs.discard(timeout)
