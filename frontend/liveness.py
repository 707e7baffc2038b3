"""Stub liveness from Triton's metrics: every Python model of the repository sets
`omni_model_heartbeat_seconds{model}` to the current unix time once a second, and
`omni_model_healthy{model}` to 0 while one of its worker loops (e.g. an engine loop) restarts after a
crash (see omni_backends.serving.metrics). Triton keeps a model READY after its stub process died,
so /health also treats a stale heartbeat, or an unhealthy worker, as "not ready"."""
from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

HEARTBEAT = "omni_model_heartbeat_seconds"
HEALTHY = "omni_model_healthy"


class HeartbeatReader:
    """Reads the heartbeats from Triton's metrics endpoint with one pooled HTTP client (opened on first
    use inside the server's event loop; creating an httpx client per probe cost ~25 ms of CPU, which
    made each /health cost 30x a transcription server's)."""

    def __init__(self, metrics_url: str):
        self.metrics_url = metrics_url
        self._client: httpx.AsyncClient | None = None

    async def stale_models(self, models: list[str], stale_after_s: float) -> list[str]:
        """Models among `models` whose last heartbeat is older than stale_after_s seconds.
        Models that never reported one (e.g. ensembles, which have no stub) are not judged here.
        Raises httpx.HTTPError if the metrics endpoint cannot be read."""
        beats = (await self._by_model((HEARTBEAT,)))[HEARTBEAT]
        return _stale(models, beats, stale_after_s)

    async def unhealthy_models(self, models: list[str], stale_after_s: float) -> list[str]:
        """Models among `models` with a stale heartbeat (as `stale_models`) or a worker loop that is
        restarting (omni_model_healthy 0). Raises httpx.HTTPError if the metrics cannot be read."""
        values = await self._by_model((HEARTBEAT, HEALTHY))
        stale = set(_stale(models, values[HEARTBEAT], stale_after_s))
        return [m for m in models if m in stale or values[HEALTHY].get(m, 1.0) == 0]

    async def metrics_text(self) -> str:
        """Triton's whole metrics page (Prometheus text: nv_* and the stubs' omni_* families). Raises
        httpx.HTTPError if it cannot be read."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=2.0)
        return (await self._client.get(self.metrics_url)).raise_for_status().text

    async def _by_model(self, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
        text = await self.metrics_text()
        lines = "\n".join(line for line in text.splitlines() if line.startswith(names))  # skip nv_* metrics
        values: dict[str, dict[str, float]] = {name: {} for name in names}
        for family in text_string_to_metric_families(lines):
            for sample in family.samples:
                values[family.name][sample.labels.get("model", "")] = sample.value
        return values

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _stale(models: list[str], beats: dict[str, float], stale_after_s: float) -> list[str]:
    """Models among `models` whose heartbeat (unix time) in `beats` is older than stale_after_s; models
    without one are not judged."""
    now = time.time()
    return [m for m in models if m in beats and now - beats[m] > stale_after_s]
