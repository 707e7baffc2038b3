"""The Triton calls of a realtime session (gRPC, no model code): the session's voice-activity stream on
the sequence-batched VAD model, transcription of committed audio on the ASR stage."""
from __future__ import annotations

import json
import secrets
import time

import numpy as np

from omni_frontend.triton_client import TritonClient


# A sequence idle this long is ENDed and a new one STARTed with the next audio: a third of voice_vad's
# max_sequence_idle_microseconds (30 s), after which Triton frees the slot and the model forgets the state, so
# a session silent for long never feeds a sequence that is gone (a request without START would be refused).
VAD_REFRESH_S = 10.0
# A VAD request is answered in milliseconds; one that waits longer is stuck (e.g. queued behind sequence slots that
# abandoned clients hold) and fails with 504 instead of hanging the session's turn detection.
VAD_TIMEOUT_S = 5.0
_OFFSETS = ("audio_start", "audio_end", "sample")   # the sample offsets of a VAD event


class VADSequence:
    """One session's sequence on the VAD model (e.g. voice_vad; contract in
    omni_backends/voice/serving/vad_model.py). The first `feed` starts it, `close` ends it.
    Sample offsets in the returned events count 16 kHz samples from the first sample fed since `restart`
    (across the refreshes after VAD_REFRESH_S without a feed, which keep counting)."""

    def __init__(self, client: TritonClient, model: str, options: dict):
        self.client, self.model, self.options = client, model, options
        self.restart()

    def restart(self) -> None:
        """Forget the sequence (`close` it first if it may hold a slot, e.g. after a failed request): the next
        `feed` starts a new one, offsets from 0."""
        self.correlation_id = secrets.randbits(63) or 1
        self.started = False
        self.fed = self.base = 0          # samples fed since restart; of them, before the current sequence
        self.last_feed = time.monotonic()

    async def feed(self, pcm: np.ndarray) -> list[dict]:
        """Send float32 16 kHz samples; returns the turn events they completed. Raises APIError."""
        if self.started and time.monotonic() - self.last_feed > VAD_REFRESH_S:
            await self.close()   # idle: end it before the model's idle timeout drops it; a new one starts now
            self.correlation_id, self.base = secrets.randbits(63) or 1, self.fed
        start, self.started = not self.started, True
        self.last_feed = time.monotonic()
        outputs = await self.client.infer(self.model, self._inputs(pcm), sequence_id=self.correlation_id,
                                          sequence_start=start, timeout_s=VAD_TIMEOUT_S)
        self.fed += int(np.asarray(pcm).size)
        found = json.loads(outputs["EVENTS"].reshape(-1)[0])
        for event in found:
            for key in _OFFSETS:
                if isinstance(event.get(key), int):
                    event[key] += self.base
        return found

    async def close(self) -> None:
        """End the sequence (frees its state in the model and its Triton slot, also after a refused START);
        errors are ignored (the model drops idle sequences on its own)."""
        if not self.started:
            return
        self.started = False
        try:
            await self.client.infer(self.model, self._inputs(np.zeros(0, np.float32)), sequence_id=self.correlation_id,
                                    sequence_end=True, timeout_s=VAD_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the model drops idle sequences on its own
            pass

    def _inputs(self, pcm: np.ndarray) -> dict[str, np.ndarray]:
        return {"AUDIO": np.asarray(pcm, np.float32).reshape(1, -1),
                "OPTIONS": np.array([[json.dumps(self.options).encode()]], dtype=np.object_)}


async def transcribe(client: TritonClient, model: str, pcm: np.ndarray, language: str | None,
                     prompt: str | None) -> dict:
    """The ASR stage's RESULT for float32 16 kHz audio: {"text", "language", "duration", "segments"}.
    Raises APIError."""
    options = {"language": language or "en", "prompt": prompt}
    outputs = await client.infer(model, {"AUDIO": np.asarray(pcm, np.float32).reshape(1, -1),
                                         "OPTIONS": np.array([[json.dumps(options).encode()]], dtype=np.object_)})
    return json.loads(outputs["RESULT"].reshape(-1)[0])
