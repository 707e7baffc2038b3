"""Frontend settings (set by the launcher or `create_app` callers)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omni_frontend.pipelines import Pipeline


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """Cheap limits checked at the edge, before any model work (launcher flags in parentheses).

    max_body_bytes: request body in bytes, multipart overhead included; larger bodies get 413 before
        they are parsed (--max-body-bytes).
    max_text_chars: characters of all chat message texts and stop strings of one request, and of a
        transcription's `prompt` (/v1/audio/transcriptions, a realtime session's transcription), and of a realtime
        session's or response's `instructions` (--max-text-chars).
    max_messages: chat messages per request (--max-messages).
    max_audio_seconds: seconds of input audio per request: a transcription file, or all input_audio
        parts of one chat request together (--max-audio-seconds).
    max_images: image parts per chat request (--max-images).
    max_image_bytes: one input image's encoded file (a data: URL's decoded bytes or an http(s) URL's body)
        (--max-image-bytes).
    max_image_pixels: one input image's width x height, read from its header before decoding (--max-image-pixels).
    image_fetch_timeout_s: seconds to fetch one http(s) image URL (--image-fetch-timeout).
    allowed_media_domains: when not empty, the only hosts (and their subdomains) an http(s) media URL may name
        (--allowed-media-domains); allow_private_media_urls: fetch from private, loopback and link-local addresses
        too (--allow-private-media-urls; off: server-side request forgery, `omni_frontend.media_url`).
    max_speech_input_chars: characters of `input` (and `instructions`) of /v1/audio/speech.
    max_upload_bytes: the `file` of /v1/audio/transcriptions (413 above it; OpenAI's limit is 25 MB).
    send_timeout_s: how long a streamed response (SSE, raw PCM, a file in parts) may wait for its client to take
        its next part; past it the response ends (logged and counted as 499), freeing its admission slot and
        cancelling its pipeline request.
    """

    max_body_bytes: int = 32 * 1024 * 1024
    max_text_chars: int = 131072
    max_messages: int = 512
    max_audio_seconds: float = 600.0
    max_images: int = 16
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 16_777_216
    image_fetch_timeout_s: float = 10.0
    allowed_media_domains: tuple[str, ...] = ()
    allow_private_media_urls: bool = False
    max_speech_input_chars: int = 4096
    max_upload_bytes: int = 25 * 1024 * 1024
    send_timeout_s: float = 60.0


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    """Overload control per pipeline: at most `max_inflight` requests run and `max_queue` wait (FIFO);
    past that a request gets 429 with Retry-After at once. A request also gets that 429 at once when
    its expected wait passes `max_queue_wait_s`, and a queued request still waiting after
    `max_queue_wait_s` gives up with 429. `per_pipeline` overrides the bounds by pipeline name:
    {name: (max_inflight, max_queue)}. The defaults suit 2 CPU cores (the voice pipeline's RTF
    passes 1 beyond 4 concurrent streams; docs/benchmarks.md)."""

    max_inflight: int = 4
    max_queue: int = 4
    max_queue_wait_s: float = 30.0
    per_pipeline: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def of(self, pipeline: str) -> tuple[int, int]:
        """(max_inflight, max_queue) for `pipeline`."""
        return self.per_pipeline.get(pipeline, (self.max_inflight, self.max_queue))


@dataclasses.dataclass
class FrontendConfig:
    """triton_url: host:port of Triton gRPC; triton_metrics_url: Triton's /metrics (for the stub
    heartbeats /health checks; None skips that check); pipelines: the loaded ones; api_key: require
    `Authorization: Bearer <key>` on /v1 routes when set; recover_stages: restart a stage whose stub
    died (omni_frontend.stage_monitor), also one whose heartbeat is older than recover_after_stale_s;
    limits: request size limits; admission: in-flight and queue bounds per pipeline; max_image_pixels:
    largest width x height the image routes accept; image_url_ttl_s: lifetime of a `response_format:
    "url"` image in seconds. Videos: job store under `data_dir`; at most `max_queued_videos` waiting
    (429 past it) and `max_running_videos` generating at once; finished videos kept `video_ttl_s` (0:
    forever). realtime_speculation_ms: realtime sessions with server VAD start a turn's response after
    this many ms of silence, held until the turn ends (omni_frontend.realtime.speculation); None: off."""

    triton_url: str
    pipelines: list[Pipeline]
    triton_metrics_url: str | None = None
    heartbeat_stale_s: float = 5.0
    recover_stages: bool = True
    recover_after_stale_s: float = 30.0
    api_key: str | None = None
    request_timeout_s: float = 600.0
    limits: RequestLimits = dataclasses.field(default_factory=RequestLimits)
    admission: AdmissionLimits = dataclasses.field(default_factory=AdmissionLimits)
    audio_expires_s: int = 3600
    max_image_pixels: int = 1024 * 1024
    image_url_ttl_s: float = 600.0
    data_dir: Path = Path("var/data")
    max_queued_videos: int = 16
    max_running_videos: int = 2
    video_ttl_s: int = 86400
    realtime_speculation_ms: int | None = 64

    def pipeline(self, model: str, kind: str | None = None) -> Pipeline | None:
        """The loaded pipeline a client's `model` names (id or alias), optionally of one kind."""
        for p in self.pipelines:
            if model == p.name or model in p.aliases:
                return p if kind is None or p.kind == kind else None
        return None
