"""Letting go of finished BLS response iterators safely (works around a Triton 2.51 Python-backend stub bug).

A decoupled BLS call's `ResponseIterator` is a C++ object owned both by its Python wrapper and by the
stub's iterator map. Reading its FINAL queues a clean-up for the stub's "stub to parent" thread, which
erases the map entry. If the Python wrapper is dropped first, that erase drops the LAST reference on
the stub's C++ thread, which never holds the GIL, and the iterator's destructor frees the numpy arrays
of every response of the stream there: Python objects freed without the GIL, racing the model's own
threads. Observed under load (gdb: 18 of 94 iterators of a qwen3_omni run destroyed from
`Stub::SendCleanupId`) as the orchestrator stub dying with SIGSEGV inside libpython's allocator, or
hanging until the frontend reloaded it.

That thread serves its queue in order, one message at a time, and `is_cancelled()` of a request goes
through the same queue and waits for its answer. So once an `is_cancelled()` asked AFTER an iterator
finished has returned, the stub has dropped its reference and ours is the last one: finished iterators
are parked here (`park`) and dropped by the next `checkpoint(is_cancelled)`, which the BLS parents'
request contexts (`decoupled.RequestContext.cancelled`) call while they poll their client's
cancellation. Between requests a parked iterator just waits for the next request's first poll; when the
model is finalized, `release` drops what is left (the stub's shared memory, which an iterator's destructor
writes to, is gone by the time the interpreter exits: freed then, they killed the stub with SIGSEGV).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

_lock = threading.Lock()
_parked: list = []
_last_park = 0.0   # time.monotonic() of the last park
# no request is left to checkpoint with at `release`: the stub's clean-up of an iterator follows its FINAL by
# milliseconds (one queued message), so iterators parked this long ago were let go by the stub
RELEASE_SETTLE_S = 0.5


def park(iterator) -> None:
    """Keeps a finished response iterator alive until the next checkpoint."""
    global _last_park
    with _lock:
        _parked.append(iterator)
        _last_park = time.monotonic()


def release() -> None:
    """Drops every parked iterator, on this thread, at least RELEASE_SETTLE_S after the last park; call it from
    the model's `finalize` (no request is served any more)."""
    time.sleep(max(0.0, _last_park + RELEASE_SETTLE_S - time.monotonic()))
    with _lock:
        batch = _parked[:]
        _parked.clear()
    batch.clear()


def checkpoint(is_cancelled: Callable[[], bool]) -> bool:
    """Calls `is_cancelled` (a request still being served), then drops every iterator parked before the
    call, on this (Python) thread; returns what `is_cancelled` returned. If it raises, they stay parked."""
    with _lock:
        batch = _parked[:]
        _parked.clear()
    try:
        answer = is_cancelled()
    except BaseException:
        with _lock:
            _parked[:0] = batch
        raise
    batch.clear()   # the stub has let go of these: their destructors run here, with the GIL
    return answer
