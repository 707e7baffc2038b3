"""The Triton calls of a realtime session (gRPC, no model code): the session's voice-activity stream on
the sequence-batched VAD model, transcription of committed audio on the ASR stage."""
from __future__ import annotations

import json
import secrets

import numpy as np

from omni_frontend.triton_client import TritonClient


class VADSequence:
    """One session's sequence on the VAD model (e.g. voice_vad; contract in
    omni_backends/voice/serving/vad_model.py). The first `feed` starts it, `close` ends it.
    Sample offsets in the returned events count 16 kHz samples from this sequence's first sample."""

    def __init__(self, client: TritonClient, model: str, options: dict):
        self.client, self.model, self.options = client, model, options
        self.restart()

    def restart(self) -> None:
        """Forget the sequence (e.g. after a failed request): the next `feed` starts a new one."""
        self.correlation_id = secrets.randbits(63) or 1
        self.started = False

    async def feed(self, pcm: np.ndarray) -> list[dict]:
        """Send float32 16 kHz samples; returns the turn events they completed. Raises APIError."""
        start, self.started = not self.started, True
        outputs = await self.client.infer(self.model, self._inputs(pcm), sequence_id=self.correlation_id,
                                          sequence_start=start)
        return json.loads(outputs["EVENTS"].reshape(-1)[0])

    async def close(self) -> None:
        """End the sequence (frees its state in the model); errors are ignored (the session is over)."""
        if not self.started:
            return
        self.started = False
        try:
            await self.client.infer(self.model, self._inputs(np.zeros(0, np.float32)), sequence_id=self.correlation_id,
                                    sequence_end=True)
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
