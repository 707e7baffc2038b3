"""Side channel between BLS parents and their child requests (same host, shared memory).

Triton 2.51's Python backend cannot (1) cancel a BLS child request (its response iterator has no
`cancel()`), nor (2) deliver a decoupled child's error to the parent (the error response arrives
empty and error-free; an error on the FINAL response hangs the iterator). Parents and children are
stubs of one tritonserver on one host, so both travel as small files named after the child's
request id in FLAG_DIR: the parent raises `<id>.cancel`, the framework's base classes poll it
next to `is_cancelled()`; a failing child writes `<id>.error`, the parent reads it when the
child's stream ends. Only ids made of [A-Za-z0-9_-] (those `child_request_id` makes) take part.

A child id also names its parent process (`bls-<pid>_<start time>-<uuid>`): a child whose parent stub
died (crashed, killed, or ended by the frontend's reload of a hung stage) counts as stopped too
(`owner_gone`, looked up in /proc at most every OWNER_POLL_S per parent), so the work it had in flight
(engine rows, talker and code2wav sequences) ends within about a second instead of running on, or
waiting for an idle timeout, with nobody to read it; and nothing is sent to a dead parent any more
(`decoupled.send_response`: such a send never returns).
"""
from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

FLAG_DIR = Path(os.environ.get("OMNI_SIDECHANNEL_DIR", f"/dev/shm/omni-triton-{os.getuid()}"))
_SAFE = re.compile(r"^bls-[A-Za-z0-9_-]{1,124}$")
_OWNER = re.compile(r"^bls-(\d+)_(\d+)-")
OWNER_POLL_S = 0.5
_owners: dict[str, tuple[float, bool]] = {}   # "bls-<pid>_<start>-" -> (time.monotonic() of the look-up, gone)


def _start_time(pid: int) -> str | None:
    """A running process's start time (clock ticks after boot, /proc/<pid>/stat field 22); None when
    there is no such process or it is a zombie (a dead stub stays one until tritonserver reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else fields[19]


_SELF = f"{os.getpid()}_{_start_time(os.getpid())}"


def child_request_id() -> str:
    """A fresh request id for a BLS child request of this process."""
    return f"bls-{_SELF}-{uuid.uuid4().hex}"


def owner_gone(request_id: str | None, max_age_s: float = OWNER_POLL_S) -> bool:
    """True when `request_id` is a BLS child id whose parent process no longer runs (pid gone, a
    zombie, or reused by a process started at another time). An answer up to `max_age_s` old may be
    reused (0: look now, as right before a send: `serving.outbox`)."""
    match = _OWNER.match(request_id or "")
    if match is None:
        return False
    owner, now = match.group(0), time.monotonic()
    checked = _owners.get(owner)
    if checked is None or (not checked[1] and now - checked[0] >= max_age_s):
        checked = _owners[owner] = (now, _start_time(int(match.group(1))) != match.group(2))
    return checked[1]


def is_child(request_id: str | None) -> bool:
    """True for the id of a BLS child request (made by `child_request_id`)."""
    return bool(_SAFE.match(request_id or ""))


def stop_requested(request_id: str | None, is_cancelled: Callable[[], bool]) -> bool:
    """Whether a request's caller gave up: for a BLS child, its parent raised the cancel flag or died
    (Triton never cancels a BLS child, so `is_cancelled()`, a round trip to the server, is not asked);
    for any other request, `is_cancelled()` (the client cancelled its gRPC stream)."""
    if is_child(request_id):
        return cancel_requested(request_id) or owner_gone(request_id)
    return is_cancelled()


def request_abandoned(request) -> bool:
    """A non-decoupled request's caller left: the client cancelled it (a deadline, a closed stream), or its BLS
    parent raised the cancel flag or died. Clears the request's side-channel files when it did."""
    request_id = request.request_id()
    try:
        gone = stop_requested(request_id, request.is_cancelled)
    except Exception:  # noqa: BLE001 - is_cancelled() is best effort (older backends lack it)
        return False
    if gone:
        clear(request_id)
    return gone


def _path(request_id: str, kind: str) -> Path | None:
    return FLAG_DIR / f"{request_id}.{kind}" if _SAFE.match(request_id or "") else None


def request_cancel(request_id: str) -> None:
    """Asks the model serving child request `request_id` to stop."""
    path = _path(request_id, "cancel")
    if path is not None:
        FLAG_DIR.mkdir(parents=True, exist_ok=True)
        path.touch()


def cancel_requested(request_id: str) -> bool:
    """True once the BLS parent asked child request `request_id` to stop."""
    path = _path(request_id, "cancel")
    return path is not None and path.exists()


def report_error(request_id: str, message: str) -> None:
    """Called by a failing child: leaves `message` (an error text or OpenAI envelope) for the parent."""
    path = _path(request_id, "error")
    if path is not None:
        FLAG_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(message)


def take_error(request_id: str) -> str | None:
    """Called by the parent when the child's stream ended: the child's error, if it reported one."""
    path = _path(request_id, "error")
    if path is None or not path.exists():
        return None
    message = path.read_text()
    path.unlink(missing_ok=True)
    return message


def clear(request_id: str) -> None:
    """Removes the cancel flag of a finished child request."""
    path = _path(request_id, "cancel")
    if path is not None:
        path.unlink(missing_ok=True)
