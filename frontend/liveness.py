"""Stub liveness from Triton's metrics: every Python model of the repository sets
`omni_model_heartbeat_seconds{model}` to the current unix time once a second (see
omni_backends.serving.metrics). Triton keeps a model READY after its stub process died, so
/health also treats a stale heartbeat as "not ready"."""
from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

HEARTBEAT = "omni_model_heartbeat_seconds"


async def stale_models(metrics_url: str, models: list[str], stale_after_s: float) -> list[str]:
    """Models among `models` whose last heartbeat is older than stale_after_s seconds.
    Models that never reported one (e.g. ensembles, which have no stub) are not judged here.
    Raises httpx.HTTPError if the metrics endpoint cannot be read."""
    async with httpx.AsyncClient(timeout=2.0) as client:
        text = (await client.get(metrics_url)).raise_for_status().text
    beats: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == HEARTBEAT:
            for sample in family.samples:
                beats[sample.labels.get("model", "")] = sample.value
    now = time.time()
    return [m for m in models if m in beats and now - beats[m] > stale_after_s]
