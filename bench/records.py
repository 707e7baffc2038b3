"""What one benchmarked request leaves behind: its send time, every chunk's arrival, and its output.

Times are seconds from `time.perf_counter()`: `send_time` counts from the start of the run, chunk
times `t` count from the request's own send, so a record reads the same whatever the run's offset.
"""
from __future__ import annotations

import dataclasses

TEXT, AUDIO, IMAGE, OTHER = "text", "audio", "image", "other"


@dataclasses.dataclass
class Chunk:
    """One event of a response as it arrived.

    t: seconds since the request was sent; kind: "text" (a non-empty text delta), "audio" (an audio
    packet), "image" (an image of the response, size in encoded bytes), "other" (role/finish/usage/done events, the whole body of a non-streamed reply);
    size: characters of text or bytes of audio payload (after base64 decoding, headers included);
    samples: audio samples the packet decodes to (0 for other kinds).
    """

    t: float
    kind: str
    size: int = 0
    samples: int = 0


@dataclasses.dataclass
class RequestRecord:
    """One request of a run.

    index: position in the prompt list; prompt: its text; send_time: seconds since the run started;
    chunks: every event in arrival order; text: the whole text answer (the transcript for
    transcription); completion_tokens: generated text tokens from the server's usage (None when it
    reported none; see client.text_tokens);
    audio_samples / sample_rate: decoded output audio; input_audio_s: seconds of audio sent
    (transcription); images: images received (images workload); video_frames: frames of the finished video
    (videos workload); error: the failure message, None when the request succeeded.
    """

    index: int
    prompt: str
    send_time: float = 0.0
    chunks: list[Chunk] = dataclasses.field(default_factory=list)
    text: str = ""
    completion_tokens: int | None = None
    audio_samples: int = 0
    sample_rate: int | None = None
    input_audio_s: float | None = None
    images: int = 0
    video_frames: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def add(self, t: float, kind: str, size: int = 0, samples: int = 0) -> None:
        """Record one arrival; audio samples are also added to the running total."""
        self.chunks.append(Chunk(t, kind, size, samples))
        self.audio_samples += samples

    def to_json(self) -> dict:
        """The record as JSON-ready dict (chunks as {"t", "kind", "size", "samples"})."""
        return {**dataclasses.asdict(self), "ok": self.ok}
