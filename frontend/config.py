"""Frontend settings (set by the launcher or `create_app` callers)."""
from __future__ import annotations

import dataclasses

from omni_frontend.pipelines import Pipeline


@dataclasses.dataclass
class FrontendConfig:
    """triton_url: host:port of Triton gRPC; triton_metrics_url: Triton's /metrics (for the stub
    heartbeats /health checks; None skips that check); pipelines: the loaded ones; api_key: require
    `Authorization: Bearer <key>` on /v1 routes when set; recover_stages: restart a stage whose stub
    died (omni_frontend.stage_monitor), also one whose heartbeat is older than recover_after_stale_s;
    limits in characters / bytes / seconds."""

    triton_url: str
    pipelines: list[Pipeline]
    triton_metrics_url: str | None = None
    heartbeat_stale_s: float = 5.0
    recover_stages: bool = True
    recover_after_stale_s: float = 30.0
    api_key: str | None = None
    request_timeout_s: float = 600.0
    max_speech_input_chars: int = 4096
    max_upload_bytes: int = 25 * 1024 * 1024
    audio_expires_s: int = 3600

    def pipeline(self, model: str, kind: str | None = None) -> Pipeline | None:
        """The loaded pipeline a client's `model` names (id or alias), optionally of one kind."""
        for p in self.pipelines:
            if model == p.name or model in p.aliases:
                return p if kind is None or p.kind == kind else None
        return None
