"""Streaming voice-activity detection with Silero VAD (the `silero_vad.onnx` of the `silero-vad` wheel,
run by onnxruntime), batched across streams, with OpenAI server-VAD turn semantics.

Silero VAD v5/v6 scores 512-sample windows of 16 kHz audio, each preceded by the last 64 samples of
the previous window (its context), and carries a recurrent state float32 [2, batch, 128]. One
`VADStream` per audio stream (a realtime session) holds that state, its context, the samples not yet
scored and the turn state; `SileroVAD.process` scores every pending window of many streams with one
ONNX call per window position (batch = the streams that still have a window), so concurrent sessions
share each forward. Turn logic follows silero's `VADIterator` (hysteresis: speech starts at a
probability >= threshold, counts as silence below max(threshold - 0.15, 0.01)) with OpenAI's
`turn_detection` fields: `prefix_padding_ms` of audio before the detected start belongs to the turn,
and speech stops after `silence_duration_ms` of continuous silence. With `pause_duration_ms` (shorter than
`silence_duration_ms`) a stream also reports the pauses inside a turn: `speech_paused` once the silence has
lasted that long, then either `speech_resumed` (speech again before `silence_duration_ms`) or the turn's
`speech_stopped`; a server can start answering at the pause (a preemptive response). No torch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from omni_backends.errors import RequestError

SAMPLE_RATE = 16000
WINDOW = 512  # samples per score at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous window prepended to each window
STATE_SHAPE = (2, 128)
HYSTERESIS = 0.15


def onnx_path() -> Path:
    """`silero_vad.onnx` inside the installed `silero-vad` wheel (opset 16, 8/16 kHz)."""
    from importlib import resources

    from omni_backends.voice.models import require_package

    require_package("silero_vad", "silero-vad")
    return Path(str(resources.files("silero_vad.data").joinpath("silero_vad.onnx")))


@dataclasses.dataclass(frozen=True)
class VADOptions:
    """OpenAI `turn_detection` (server_vad) fields: threshold in [0, 1]; prefix_padding_ms and
    silence_duration_ms in milliseconds (>= 0); plus pause_duration_ms (ours, None = no pause events):
    the silence in ms after which a turn counts as paused (only reported when shorter than
    silence_duration_ms). Raises RequestError naming the field otherwise."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    pause_duration_ms: int | None = None

    def __post_init__(self):
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or not 0.0 <= self.threshold <= 1.0:
            raise RequestError(f"threshold must be a number in [0, 1], got {self.threshold!r}", param="threshold")
        for name in ("prefix_padding_ms", "silence_duration_ms", "pause_duration_ms"):
            value = getattr(self, name)
            if value is None and name == "pause_duration_ms":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 60_000:
                raise RequestError(f"{name} must be an integer in [0, 60000], got {value!r}", param=name)

    @classmethod
    def from_json(cls, body: Mapping) -> "VADOptions":
        """Options from a JSON object; missing or null fields keep the defaults, other keys are ignored."""
        return cls(**{f.name: body[f.name] for f in dataclasses.fields(cls) if body.get(f.name) is not None})

    @property
    def prefix_samples(self) -> int:
        return self.prefix_padding_ms * SAMPLE_RATE // 1000

    @property
    def silence_samples(self) -> int:
        return self.silence_duration_ms * SAMPLE_RATE // 1000

    @property
    def pause_samples(self) -> int | None:
        """Samples of silence that make a pause; None when pauses are not reported."""
        if self.pause_duration_ms is None or self.pause_duration_ms >= self.silence_duration_ms:
            return None
        return self.pause_duration_ms * SAMPLE_RATE // 1000


class VADStream:
    """State of one audio stream: Silero's recurrent state and context, unscored samples, and the turn
    state. Sample offsets count 16 kHz samples from the stream's first sample."""

    def __init__(self, options: VADOptions = VADOptions()):
        self.options = options
        self.state = np.zeros(STATE_SHAPE, np.float32)
        self.context = np.zeros(CONTEXT, np.float32)
        self.pending = np.zeros(0, np.float32)
        self.scored = 0  # samples already scored (a multiple of WINDOW)
        self.speaking = False
        self.silence_start: int | None = None
        self.paused = False  # a speech_paused was reported for the current silence

    def feed(self, pcm: np.ndarray) -> None:
        """Queue float32 [samples] mono 16 kHz audio for scoring."""
        self.pending = np.concatenate([self.pending, np.asarray(pcm, np.float32).reshape(-1)])

    @property
    def windows(self) -> int:
        return self.pending.size // WINDOW

    def decide(self, probability: float) -> dict | None:
        """Advance the turn state by one scored window; returns an event or None.

        {"type": "speech_started", "audio_start": sample (detected window start minus the prefix padding,
        >= 0), "sample": end of the detecting window}; {"type": "speech_paused", "audio_end": sample where
        the silence began, "sample": end of the window that completed pause_duration_ms};
        {"type": "speech_resumed", "audio_start": start of the speech window after the pause, "sample": its
        end}; {"type": "speech_stopped", "audio_end": sample where the silence began, "sample": end of the
        window that completed silence_duration_ms}.
        """
        start, end = self.scored - WINDOW, self.scored
        threshold = self.options.threshold
        if probability >= threshold:
            self.silence_start = None
            if not self.speaking:
                self.speaking = True
                return {"type": "speech_started", "audio_start": max(0, start - self.options.prefix_samples),
                        "sample": end}
            if self.paused:
                self.paused = False
                return {"type": "speech_resumed", "audio_start": start, "sample": end}
        elif self.speaking and probability < max(threshold - HYSTERESIS, 0.01):
            if self.silence_start is None:
                self.silence_start = start
            if end - self.silence_start >= self.options.silence_samples:
                stopped, self.speaking, self.silence_start, self.paused = self.silence_start, False, None, False
                return {"type": "speech_stopped", "audio_end": stopped, "sample": end}
            pause = self.options.pause_samples
            if pause is not None and not self.paused and end - self.silence_start >= pause:
                self.paused = True
                return {"type": "speech_paused", "audio_end": self.silence_start, "sample": end}
        return None


class SileroVAD:
    """One onnxruntime session of Silero VAD shared by many streams (not thread-safe: one caller at a time).

    path: the ONNX file (default: `onnx_path()`); threads: onnxruntime intra-op threads.
    """

    def __init__(self, path: Path | None = None, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self._session = ort.InferenceSession(str(path or onnx_path()), sess_options=options,
                                             providers=["CPUExecutionProvider"])
        self._rate = np.array(SAMPLE_RATE, dtype=np.int64)

    def score(self, windows: np.ndarray, contexts: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One forward: windows float32 [batch, 512], contexts [batch, 64], states [2, batch, 128] ->
        (speech probabilities float32 [batch], new states [2, batch, 128])."""
        x = np.concatenate([contexts, windows], axis=1).astype(np.float32, copy=False)
        probs, states = self._session.run(None, {"input": x, "state": states, "sr": self._rate})
        return np.asarray(probs, np.float32).reshape(-1), states

    def process(self, streams: Sequence[VADStream]) -> list[tuple[np.ndarray, list[dict]]]:
        """Scores every complete pending window of every stream (batched across streams) and advances
        their turn state. Returns, per stream, (probabilities float32 [windows scored], events in order);
        samples short of a window stay pending."""
        probs: list[list[float]] = [[] for _ in streams]
        events: list[list[dict]] = [[] for _ in streams]
        while True:
            live = [i for i, s in enumerate(streams) if s.windows]
            if not live:
                break
            windows = np.stack([streams[i].pending[:WINDOW] for i in live])
            contexts = np.stack([streams[i].context for i in live])
            states = np.stack([streams[i].state for i in live], axis=1)
            scores, states = self.score(windows, contexts, states)
            for row, i in enumerate(live):
                stream = streams[i]
                stream.state = np.ascontiguousarray(states[:, row])
                stream.context = windows[row, -CONTEXT:].copy()
                stream.pending = stream.pending[WINDOW:]
                stream.scored += WINDOW
                probs[i].append(float(scores[row]))
                event = stream.decide(float(scores[row]))
                if event is not None:
                    events[i].append(event)
        return [(np.array(p, np.float32), e) for p, e in zip(probs, events)]
