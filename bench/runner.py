"""Runs one benchmark level: warm-ups, then every prompt sent on a Poisson schedule under a concurrency cap."""
from __future__ import annotations

import asyncio
import math
import time

import httpx
import numpy as np

from collections.abc import Awaitable, Callable

from omni_bench.records import RequestRecord

SendFn = Callable[[int, str, float], Awaitable[RequestRecord]]   # (index, prompt, run start) -> record


def http_client(base_url: str, api_key: str | None, timeout_s: float, max_concurrency: int | None) -> httpx.AsyncClient:
    """An async client for the frontend with enough pooled connections for the concurrency cap."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    connections = max(max_concurrency or 0, 64)
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s,
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))


async def run_level(send: SendFn, prompts: list[str], *, max_concurrency: int | None, request_rate: float,
                    num_warmups: int, seed: int) -> tuple[list[RequestRecord], float]:
    """Records of every prompt (in prompt order) and the run's duration in seconds; `send` sends one request
    (over HTTP to the frontend, or over gRPC to Triton) and returns its record.

    Warm-ups (the first `num_warmups` prompts, one at a time) are sent first and not recorded. Then
    request i is released at the i-th arrival of a Poisson process of `request_rate` per second (all
    at once for inf) and sent when fewer than `max_concurrency` requests are in flight (None: no cap).
    The duration runs from the first release to the last completion.
    """
    for index, prompt in enumerate(prompts[:num_warmups]):
        await send(index, prompt, time.perf_counter())
    gaps = np.random.default_rng(seed).exponential(1.0 / request_rate, len(prompts)) \
        if math.isfinite(request_rate) else np.zeros(len(prompts))
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(index: int, prompt: str) -> RequestRecord:
        if gate is None:
            return await send(index, prompt, start)
        async with gate:
            return await send(index, prompt, start)

    tasks = []
    for index, prompt in enumerate(prompts):
        tasks.append(asyncio.create_task(one(index, prompt)))
        if gaps[index] > 0 and index + 1 < len(prompts):
            await asyncio.sleep(gaps[index])
    records = list(await asyncio.gather(*tasks))
    return records, time.perf_counter() - start
