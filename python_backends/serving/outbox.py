"""Sends of BLS children's responses, on a thread that a dying parent cannot take the stage down with.

Triton 2.51 hands a BLS child's response to the parent's stub and waits until that stub takes it, so a
send to a parent that died never returns. Sent from a stage's own loop, one such send stopped the whole
stage for good (the talker's only worker thread, after a crashed orchestrator). So a child's sends
(responses and FINAL, `decoupled.send_response` / `send_final`) go through this process's outbox: one
thread sends them in order (so each request's responses keep their order), skipping those whose parent
is already gone (`sidechannel.owner_gone`, looked up right before each send). A watchdog checks the
send in progress every WATCH_S: when it has taken longer than STUCK_S and its parent is gone, that
thread is given up (it stays blocked inside Triton) and a fresh thread sends the rest.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from omni_backends.serving import sidechannel

log = logging.getLogger(__name__)
WATCH_S = 0.25
STUCK_S = 0.5


class Outbox:
    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._generation = 0
        self._current: tuple[int, str, float] | None = None   # (generation, request id, time.monotonic() sent)
        self.abandoned = 0
        self._spawn()
        threading.Thread(target=self._watch, name="outbox-watchdog", daemon=True).start()

    def put(self, request_id: str, send: Callable[[], None]) -> None:
        """Queue `send()` (one `sender.send(...)` of child request `request_id`)."""
        self._queue.put((request_id, send))

    def _spawn(self) -> None:
        threading.Thread(target=self._run, args=(self._generation,), name=f"outbox-{self._generation}",
                         daemon=True).start()

    def _run(self, generation: int) -> None:
        while generation == self._generation:
            request_id, send = self._queue.get()
            if sidechannel.owner_gone(request_id, max_age_s=0):
                continue
            with self._lock:
                self._current = (generation, request_id, time.monotonic())
            try:
                send()
            except Exception:  # noqa: BLE001 - one failed send must not stop the others
                log.exception("sending a response of %s failed", request_id)
            with self._lock:
                if self._current is not None and self._current[0] == generation:
                    self._current = None

    def _watch(self) -> None:
        while True:
            time.sleep(WATCH_S)
            with self._lock:
                current = self._current
                if current is None or time.monotonic() - current[2] < STUCK_S:
                    continue
                if not sidechannel.owner_gone(current[1], max_age_s=0):
                    continue
                self._generation += 1
                self._current = None
                self.abandoned += 1
                self._spawn()
            log.warning("a send to the dead BLS parent of %s never returned: its thread is given up", current[1])


_outbox: Outbox | None = None
_outbox_lock = threading.Lock()


def put(request_id: str, send: Callable[[], None]) -> None:
    """Queue `send()` on this process's outbox (started on first use)."""
    global _outbox
    with _outbox_lock:
        if _outbox is None:
            _outbox = Outbox()
    _outbox.put(request_id, send)
