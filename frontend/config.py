"""Frontend settings (set by the launcher or `create_app` callers)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omni_frontend.pipelines import Pipeline


@dataclasses.dataclass
class FrontendConfig:
    """triton_url: host:port of Triton gRPC; triton_metrics_url: Triton's /metrics (for the stub
    heartbeats /health checks; None skips that check); pipelines: the loaded ones; api_key: require
    `Authorization: Bearer <key>` on /v1 routes when set; limits in characters / bytes / seconds / pixels
    (max_image_pixels: largest width x height the image routes accept; image_url_ttl_s: lifetime of a
    `response_format: "url"` image). Videos: job store under `data_dir`; at most `max_queued_videos`
    waiting (429 past it) and `max_running_videos` generating at once; finished videos kept `video_ttl_s`
    (0: forever)."""

    triton_url: str
    pipelines: list[Pipeline]
    triton_metrics_url: str | None = None
    heartbeat_stale_s: float = 5.0
    api_key: str | None = None
    request_timeout_s: float = 600.0
    max_speech_input_chars: int = 4096
    max_upload_bytes: int = 25 * 1024 * 1024
    audio_expires_s: int = 3600
    max_image_pixels: int = 1024 * 1024
    image_url_ttl_s: float = 600.0
    data_dir: Path = Path("var/data")
    max_queued_videos: int = 16
    max_running_videos: int = 2
    video_ttl_s: int = 86400

    def pipeline(self, model: str, kind: str | None = None) -> Pipeline | None:
        """The loaded pipeline a client's `model` names (id or alias), optionally of one kind."""
        for p in self.pipelines:
            if model == p.name or model in p.aliases:
                return p if kind is None or p.kind == kind else None
        return None
