"""Leases of the live sequences of a sequence-batched stateful stage (talker, code2wav).

A sequence (correlation id) lives from its START request to its END or ABORT, with no request open
in between; if its caller never sends the END (the client left and the ABORT was lost, or the BLS
parent's stub died) only the stage itself can end it. `SequenceLeases` remembers when each sequence
got its last request and which request started it, and `expired()` names those to end: idle longer
than `idle_s` (the config's `max_sequence_idle_microseconds`, after which Triton frees the slot), or
started by a BLS parent whose process is gone (`sidechannel.owner_gone`: ended within about a second
of a crashed or reloaded orchestrator instead of after the idle timeout).
Not thread-safe: use it from one thread, or under the stage's lock.
"""
from __future__ import annotations

import time

from omni_backends.errors import RequestError
from omni_backends.serving import sidechannel


def check_room(model_name: str, live: int, limit: int) -> None:
    """Refuse a new sequence's START while `live` sequences already fill the stage's `limit` (the config
    parameter `max_sequences`). Triton's `oldest` strategy has no refusal: past its `max_candidate_sequences`
    slots a new sequence waits, unanswered, until a slot frees (an END or the idle timeout), so each stateful
    stage keeps more slots than `limit` and answers the START beyond `limit` itself, at once.
    Raises RequestError 429 `too_many_sequences`."""
    if live >= limit:
        raise RequestError(f"{model_name} serves at most {limit} live sequences: END the ones no longer used, or "
                           "retry once others end", code="too_many_sequences", status=429)


class SequenceLeases:
    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._seen: dict[int | str, float] = {}     # sequence -> time.monotonic() of its last request
        self._starter: dict[int | str, str] = {}    # sequence -> request id of its START request

    def touch(self, sequence: int | str, request_id: str) -> None:
        """A request of `sequence` arrived (the first one touched is taken as its START)."""
        self._seen[sequence] = time.monotonic()
        self._starter.setdefault(sequence, request_id)

    def forget(self, sequence: int | str) -> None:
        self._seen.pop(sequence, None)
        self._starter.pop(sequence, None)

    def expired(self, busy=()) -> dict[int, str]:
        """{sequence: why} of the sequences to end ("idle" or "owner gone"), except those in `busy`
        (sequences with a request open: the stage polls those itself)."""
        now, found = time.monotonic(), {}
        for sequence, seen in self._seen.items():
            if sequence in busy:
                continue
            if now - seen > self.idle_s:
                found[sequence] = "idle"
            elif sidechannel.owner_gone(self._starter.get(sequence)):
                found[sequence] = "owner gone"
        return found
