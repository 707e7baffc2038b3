"""BatchLoop: the thread skeleton shared by the engine loops (EngineLoop for autoregressive stages,
omni_backends.diffusion.DenoiseLoop for denoisers).

Thread-safe `_enqueue` / `abort` / `shutdown`; the thread sleeps on a Condition while nothing is live,
admits waiting requests FIFO up to `max_running`, applies aborts, and calls the subclass's
`_iterate(admitted)` once per iteration. Requests are any objects with a `request_id`.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Sequence


class BatchLoop:
    """Subclasses implement `_iterate(admitted)` (one iteration over `self._running`, the just-admitted
    requests included) and `_finish_aborted(requests)` (their final outputs, after `_release`)."""

    def __init__(self, *, max_running: int, name: str) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.max_running = max_running
        self._cond = threading.Condition()
        self._waiting: deque = deque()
        self._running: dict[str, object] = {}
        self._aborts: set[str] = set()
        self._in_flight: set[str] = set()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _enqueue(self, request) -> None:
        """Queue a request for the next iteration. Raises ValueError when its id is already in flight,
        RuntimeError after shutdown()."""
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"{type(self).__name__} is shut down")
            if request.request_id in self._in_flight:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            self._in_flight.add(request.request_id)
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

    def shutdown(self, timeout: float | None = None) -> None:
        """Abort every request in flight, stop the thread and join it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # ---- loop thread -------------------------------------------------------------------------------
    def _iterate(self, admitted: list) -> None:
        raise NotImplementedError

    def _finish_aborted(self, requests: Sequence) -> None:
        raise NotImplementedError

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
            self._in_flight.discard(request.request_id)
        return was_running
