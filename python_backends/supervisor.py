"""Keeps a shared worker loop (an engine loop, a stage's worker or sender thread) alive.

A worker loop serves every request of a stage; if an exception escapes it, the thread dies and every
later request waits forever. `Supervisor` runs the loop on a daemon thread; when the loop raises, it
calls `recover(exc)` (fail the work in flight, reset the loop's state), reports itself unhealthy, and
starts a NEW thread that runs the loop again after a backoff (doubling from `backoff_s` up to
`max_backoff_s`; back to `backoff_s` once a run lasted `stable_after_s`). The loop returning normally
ends supervision (shutdown).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Supervisor:
    """Runs `body()` on a thread named `name` and restarts it after a crash.

    Args:
        name: thread name (also in log lines).
        body: the loop; returns when it should stop for good, raises on a failure.
        recover: called with the exception on the crashed thread, before the restart; must not raise
            (an exception from it is logged).
        on_health: called with False on a crash and True when the restarted loop runs (optional).
        backoff_s, max_backoff_s, stable_after_s: restart delays (see the module doc).

    `healthy` is False from a crash until the new thread runs `body`; `restarts` counts restarts.
    """

    def __init__(self, name: str, body: Callable[[], None], recover: Callable[[BaseException], None],
                 on_health: Callable[[bool], None] | None = None, *, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, stable_after_s: float = 60.0) -> None:
        self.name, self._body, self._recover, self._on_health = name, body, recover, on_health
        self.backoff_s, self.max_backoff_s, self.stable_after_s = backoff_s, max_backoff_s, stable_after_s
        self.healthy = True
        self.restarts = 0
        self._delay = backoff_s
        self._thread: threading.Thread | None = None

    def start(self) -> "Supervisor":
        self._spawn(0.0)
        return self

    @property
    def thread(self) -> threading.Thread | None:
        """The thread running (or about to run) the loop now."""
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        """Wait for the loop to end (follows restarts until `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (thread := self._thread) is not None:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread is self._thread or (deadline is not None and time.monotonic() >= deadline):
                return

    def _spawn(self, delay_s: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(delay_s,), name=self.name, daemon=True)
        self._thread.start()

    def _run(self, delay_s: float) -> None:
        if delay_s:
            time.sleep(delay_s)
            self._set_health(True)
        started = time.monotonic()
        try:
            self._body()
            return
        except BaseException as exc:  # noqa: BLE001 - the loop must come back whatever killed it
            log.exception("%s crashed; failing its work in flight and restarting it", self.name)
            self._set_health(False)
            try:
                self._recover(exc)
            except Exception:  # noqa: BLE001
                log.exception("%s: recovery failed", self.name)
        self._delay = self.backoff_s if time.monotonic() - started >= self.stable_after_s else self._delay
        delay, self._delay = self._delay, min(self._delay * 2, self.max_backoff_s)
        self.restarts += 1
        self._spawn(delay)

    def _set_health(self, healthy: bool) -> None:
        self.healthy = healthy
        if self._on_health is not None:
            try:
                self._on_health(healthy)
            except Exception:  # noqa: BLE001 - reporting must not take the loop down
                log.exception("%s: health callback failed", self.name)
