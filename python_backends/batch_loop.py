"""BatchLoop: the thread skeleton shared by the engine loops (EngineLoop for autoregressive stages,
omni_backends.diffusion.DenoiseLoop for denoisers).

Thread-safe `_enqueue` / `abort` / `shutdown`; the thread sleeps on a Condition while nothing is live,
admits waiting requests FIFO up to `max_running`, applies aborts, and calls the subclass's
`_iterate(admitted)` once per iteration. Requests are any objects with a `request_id`.

The thread is supervised (`omni_backends.supervisor`): no request value should raise inside the loop,
but if an exception escapes `_iterate` anyway, every request in flight is handed to the subclass's
`_fail_unavailable` (it finishes them with a retryable error: HTTP 503), `_reset` clears its state, and
a new thread runs the loop after a short backoff; meanwhile `healthy` is False and `_enqueue` raises
LoopUnavailable.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Sequence

from omni_backends.supervisor import Supervisor


class LoopUnavailable(RuntimeError):
    """The loop crashed and is restarting; the request was not queued (retry later: HTTP 503)."""


class BatchLoop:
    """Subclasses implement `_iterate(admitted)` (one iteration over `self._running`, the just-admitted
    requests included), `_finish_aborted(requests)` (their final outputs, after `_release`) and, for
    crash recovery, `_fail_unavailable(requests, message)` and optionally `_reset()`.

    on_health: called with False when the loop crashed and True once it runs again (optional; may be
    set later as the attribute `on_health`)."""

    def __init__(self, *, max_running: int, name: str, on_health: Callable[[bool], None] | None = None) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.max_running = max_running
        self.on_health = on_health
        self._cond = threading.Condition()
        self._waiting: deque = deque()
        self._running: dict[str, object] = {}
        self._aborts: set[str] = set()
        self._in_flight: dict[str, object] = {}  # id -> request, until its final output was handed over
        self._stopping = False
        self._supervisor = Supervisor(name, self._run, self._crashed, self._report_health).start()

    def _enqueue(self, request) -> None:
        """Queue a request for the next iteration. Raises ValueError when its id is already in flight,
        LoopUnavailable while the loop restarts after a crash, RuntimeError after shutdown()."""
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"{type(self).__name__} is shut down")
            if not self._supervisor.healthy:
                raise LoopUnavailable(f"{self._supervisor.name} is restarting after a failure")
            if request.request_id in self._in_flight:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            self._in_flight[request.request_id] = request
            self._waiting.append(request)
            self._cond.notify()

    def abort(self, request_id: str) -> bool:
        """Cancel a request before its next step (its final output has finish_reason "abort").

        Returns True when the request was in flight, False when unknown or already finished.
        """
        with self._cond:
            if request_id not in self._in_flight:
                return False
            self._aborts.add(request_id)
            self._cond.notify()
            return True

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished (the metric the Triton adapters export)."""
        with self._cond:
            return len(self._in_flight)

    @property
    def healthy(self) -> bool:
        """False from a crash of the loop until its restarted thread runs."""
        return self._supervisor.healthy

    @property
    def restarts(self) -> int:
        """Times the loop crashed and was restarted."""
        return self._supervisor.restarts

    def shutdown(self, timeout: float | None = None) -> None:
        """Abort every request in flight, stop the thread and join it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._supervisor.join(timeout)

    # ---- loop thread -------------------------------------------------------------------------------
    def _iterate(self, admitted: list) -> None:
        raise NotImplementedError

    def _finish_aborted(self, requests: Sequence) -> None:
        raise NotImplementedError

    def _fail_unavailable(self, requests: Sequence, message: str) -> None:
        """Finish `requests` (already released) with a retryable error after a crash of the loop."""
        raise NotImplementedError

    def _reset(self) -> None:
        """Forget the per-request state the subclass keeps (e.g. a runner's caches) after a crash."""

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._aborts or self._stopping):
                    self._cond.wait()
                if self._stopping:
                    self._aborts.update(self._in_flight)
                    admitted = []
                else:
                    room = self.max_running - len(self._running)
                    admitted = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
                    self._running.update((r.request_id, r) for r in admitted)
            self._apply_aborts()
            if self._stopping:
                return
            self._iterate([r for r in admitted if r.request_id in self._running])

    def _apply_aborts(self) -> None:
        with self._cond:
            aborts, self._aborts = self._aborts, set()
            waiting = [r for r in self._waiting if r.request_id in aborts]
            self._waiting = deque(r for r in self._waiting if r.request_id not in aborts)
        running = [self._running[rid] for rid in aborts if rid in self._running]
        self._finish_aborted(waiting + running)

    def _release(self, request) -> bool:
        """Drop a request from the running set and the in-flight counter; True if it was running."""
        with self._cond:
            was_running = self._running.pop(request.request_id, None) is not None
            self._in_flight.pop(request.request_id, None)
        return was_running

    def _crashed(self, exc: BaseException) -> None:
        """Supervisor recovery: every request in flight fails (retryable); the subclass starts empty."""
        with self._cond:
            victims = list(self._in_flight.values())  # also a request whose release raised mid-retirement
            self._waiting.clear()
            self._running.clear()
            self._aborts.clear()
            self._in_flight.clear()
        self._reset()
        self._fail_unavailable(victims, f"{self._supervisor.name} failed ({type(exc).__name__}: {exc}); it restarts, "
                                        "retry the request")

    def _report_health(self, healthy: bool) -> None:
        if self.on_health is not None:
            self.on_health(healthy)


def asks_to_stop(cancelled) -> bool:
    """A request's optional `cancelled()` probe, made safe: no probe, or a probe that fails, never
    cancels the request."""
    if cancelled is None:
        return False
    try:
        return bool(cancelled())
    except Exception:  # noqa: BLE001
        return False
