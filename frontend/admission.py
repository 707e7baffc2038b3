"""Overload control: per pipeline, at most `max_inflight` requests run and at most `max_queue` wait
for a slot (first come, first served); a request beyond both gets 429 with `Retry-After` at once,
before any model work. A request whose expected wait (recent run time x requests ahead per slot)
passes `max_queue_wait_s` gets the same 429 at once instead of queueing, and a queued request that
has waited `max_queue_wait_s` gives up with 429, so nobody waits without bound when the machine is
slower than usual. Bounds come from `config.AdmissionLimits` (launcher flags `--max-inflight`,
`--max-queue`, `--max-queue-wait`).

A route takes a ticket with `enter(request, pipeline)` (raises the 429), then awaits
`ticket.wait()` before it calls the pipeline. The ticket is released by `AdmissionMiddleware` when
the response has been sent (or the client left), so a slot can never leak, whatever path a
request takes; a queued ticket whose client leaves gives up its place. A realtime session
(`omni_frontend.realtime.session`) takes a ticket of its pipeline's gate for each response (for a
preemptive one only when a slot is free at once: `Gate.try_enter`) and releases it when the response ends.
"""
from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable

from fastapi import Request

from omni_frontend.config import AdmissionLimits
from omni_frontend.errors import APIError
from omni_frontend.observability import CLIENT_CLOSED
from omni_frontend.pipelines import Pipeline

_STATE_KEY = "admission_ticket"
_EWMA = 0.2   # weight of the newest run time in the mean that estimates Retry-After


class Gate:
    """The in-flight and queue bounds of one pipeline (used from the event loop only)."""

    def __init__(self, name: str, max_inflight: int, max_queue: int, max_wait_s: float = 30.0, metrics=None):
        self.name, self.max_inflight, self.max_queue, self.metrics = name, max_inflight, max_queue, metrics
        self.max_wait_s = max_wait_s
        self.running = 0
        self.waiting: collections.deque[asyncio.Future] = collections.deque()
        self.mean_run_s: float | None = None

    def try_enter(self) -> Ticket | None:
        """A ticket holding a slot now, or None when no slot is free (nothing queued, nothing counted as
        rejected): for optional work, such as a realtime turn's preemptive response."""
        if self.running >= self.max_inflight or self.waiting:
            return None
        self.running += 1
        self._publish()
        return Ticket(self, None)

    def enter(self) -> Ticket:
        """A ticket that runs now or waits in the queue; raises APIError 429 (code `pipeline_overloaded`)
        when the queue is full."""
        ticket = self.try_enter()
        if ticket is not None:
            return ticket
        if len(self.waiting) < self.max_queue and self.expected_wait_s() <= self.max_wait_s:
            future = asyncio.get_running_loop().create_future()
            self.waiting.append(future)
            ticket = Ticket(self, future)
        else:
            raise self.overloaded(f"pipeline '{self.name}' is at capacity ({self.running} running, "
                                  f"{len(self.waiting)} queued, expected wait {self.expected_wait_s():.0f} s; limits "
                                  f"--max-inflight {self.max_inflight}, --max-queue {self.max_queue}, "
                                  f"--max-queue-wait {self.max_wait_s:g})", "pipeline_overloaded")
        self._publish()
        return ticket

    def expected_wait_s(self) -> float:
        """Expected wait of a request queued now: the mean run time of recent requests times the
        requests ahead of it per slot (0 before any request ran)."""
        return (self.mean_run_s or 0.0) * (len(self.waiting) + 1) / self.max_inflight

    def overloaded(self, message: str, code: str) -> APIError:
        """The 429 (counted) with Retry-After: the expected wait in whole seconds, between 1 and 60."""
        if self.metrics:
            self.metrics.rejected.labels(self.name).inc()
        retry = max(1, min(60, math.ceil(self.expected_wait_s())))
        return APIError(429, f"{message}; retry after {retry} s", code=code, headers={"retry-after": str(retry)})

    def record_run(self, run_s: float) -> None:
        """Feeds one request's run time (seconds holding a slot) into the mean behind Retry-After and the expected
        wait. Tickets do it when released; a batch, whose ticket holds its slot for many requests' work, untimes its
        tickets and records each item instead (omni_frontend.batching)."""
        self.mean_run_s = run_s if self.mean_run_s is None else (1 - _EWMA) * self.mean_run_s + _EWMA * run_s

    def _free_slot(self, run_s: float | None) -> None:
        if run_s is not None:
            self.record_run(run_s)
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(None)   # the slot passes to the first live waiter
                break
        else:
            self.running -= 1
        self._publish()

    def _leave_queue(self, future: asyncio.Future) -> None:
        try:
            self.waiting.remove(future)
        except ValueError:
            pass
        future.cancel()
        self._publish()

    def _publish(self) -> None:
        if self.metrics:
            self.metrics.inflight.labels(self.name).set(self.running)
            self.metrics.queued.labels(self.name).set(sum(not f.done() for f in self.waiting))


class Ticket:
    """One request's claim on a pipeline slot: a slot at once or a queue place until `wait()` returns;
    `release()` is idempotent."""

    def __init__(self, gate: Gate, future: asyncio.Future | None):
        self.gate, self._future = gate, future
        self._admitted_at = time.perf_counter() if future is None else None
        self._released = False
        # raises the APIError of a request that may not run any more once it is admitted from the queue (set by
        # `enter`: its pipeline fell asleep meanwhile); None: nothing to check
        self.recheck: Callable[[], None] | None = None
        self.timed = True   # release() feeds the slot's hold time into the gate's mean run time (Gate.record_run)

    async def wait(self, request: Request | None = None) -> None:
        """Returns once the request holds a slot (at once when it never queued). Raises APIError 429
        (code `queue_timeout`) after the gate's max_wait_s in the queue, the APIError of `recheck` (e.g. 503
        `pipeline_sleeping`) when it refuses the request now, and APIError 499 when the HTTP
        `request`'s client left while the request was queued (its slot is never used: a request sent to
        Triton and cancelled a moment later could be missed by Triton's cancellation and run to its end).
        Cancelling the waiting task gives up the queue place (how a realtime session, `request` None,
        leaves the queue)."""
        if self._admitted_at is not None:
            return
        queued_at = time.perf_counter()
        # asyncio.wait, not wait_for: Python 3.11's wait_for swallows a cancellation that arrives as the
        # slot is handed over, which left the route's task running, and its request in Triton, after
        # the client had gone.
        admitted, _ = await asyncio.wait({self._future}, timeout=self.gate.max_wait_s)
        if not admitted:
            raise self.gate.overloaded(f"no slot of pipeline '{self.gate.name}' came free within "
                                       f"{self.gate.max_wait_s:g} s (--max-queue-wait)", "queue_timeout")
        self._admitted_at = time.perf_counter()
        if self.gate.metrics:
            self.gate.metrics.queue_wait.labels(self.gate.name).observe(self._admitted_at - queued_at)
        if request is not None and await request.is_disconnected():
            raise APIError(CLIENT_CLOSED, "client closed the request while it was queued", code="client_closed_request")
        if self.recheck is not None:
            self.recheck()

    async def take_turn(self) -> None:
        """For a ticket that holds its slot for many requests' work (a batch between two items): when live requests
        wait, passes the slot to the first of them and queues at the back (past max_queue and without max_wait_s:
        it was admitted) until a slot comes back, so that a batch runs one item per turn and an ordinary request
        waits about one item's run, not a whole batch's. Returns at once when nobody waits. Cancelled while
        queued, the ticket holds nothing (its release does nothing)."""
        gate = self.gate
        if self._released or self._admitted_at is None or all(f.done() for f in gate.waiting):
            return
        gate._free_slot(None)   # a live waiter exists and nothing awaited since: the slot passes to it
        future = asyncio.get_running_loop().create_future()
        gate.waiting.append(future)
        gate._publish()
        try:
            await future
        except BaseException:
            if not (future.done() and not future.cancelled()):   # the slot did not come back: holds nothing
                self._released = True
                gate._leave_queue(future)
            raise

    def release(self) -> None:
        """Frees the slot (or the queue place) this ticket holds."""
        if self._released:
            return
        self._released = True
        future = self._future
        if future is None or (future.done() and not future.cancelled()):
            # Holds a slot: admitted at once, or a waiter the slot was handed to (even if it never resumed).
            run_s = time.perf_counter() - self._admitted_at if self._admitted_at is not None and self.timed else None
            self.gate._free_slot(run_s)
        else:
            self.gate._leave_queue(future)


class Admission:
    """The gates of every pipeline, created on first use with the configured bounds."""

    def __init__(self, limits: AdmissionLimits, metrics=None):
        self.limits, self.metrics = limits, metrics
        self.gates: dict[str, Gate] = {}

    def gate(self, pipeline: str) -> Gate:
        if pipeline not in self.gates:
            self.gates[pipeline] = Gate(pipeline, *self.limits.of(pipeline), max_wait_s=self.limits.max_queue_wait_s,
                                        metrics=self.metrics)
        return self.gates[pipeline]


def enter(request: Request, pipeline: Pipeline) -> Ticket:
    """Takes a ticket of `pipeline` for this request (429 when it is at capacity); the request's
    AdmissionMiddleware releases it when the response is over. A pipeline put to sleep since the route looked it
    up (while the request was validated, or queued: `Ticket.wait` checks again) is a 503 `pipeline_sleeping`: its
    models may be unloaded, and Triton answered such a request with a 500 'unknown model'."""
    control = request.app.state.control
    control.check(pipeline)
    ticket = request.app.state.admission.gate(pipeline.name).enter()
    ticket.recheck = lambda: control.check(pipeline)
    request.scope.setdefault("state", {})[_STATE_KEY] = ticket
    return ticket


class AdmissionMiddleware:
    """Pure ASGI middleware: releases the request's ticket once the response is fully sent or the
    client is gone (streamed responses hold their slot until their last event)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        finally:
            ticket = scope.get("state", {}).get(_STATE_KEY)
            if ticket is not None:
                ticket.release()
