"""A cancellation token that interrupts blocking library calls from another thread.

`CancelToken.set()` (e.g. from a stage's watcher thread once the request was abandoned) runs every
registered callback once, such as setting `onnxruntime.RunOptions.terminate` so that an ONNX run in
progress ends at once; code that checks `is_set()` between steps raises `Interrupted`.
"""
from __future__ import annotations

import threading
from collections.abc import Callable


class Interrupted(RuntimeError):
    """Work stopped because its CancelToken was set (the request was abandoned)."""


class CancelToken:
    """Thread-safe; `set()` is idempotent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def is_set(self) -> bool:
        return self._set

    def check(self) -> None:
        """Raises Interrupted once set."""
        if self._set:
            raise Interrupted("cancelled")

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Runs `callback` when set (at once if already set); returns a function that unregisters it."""
        with self._lock:
            if not self._set:
                self._callbacks.append(callback)
                return lambda: self._discard(callback)
        callback()
        return lambda: None

    def _discard(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)
