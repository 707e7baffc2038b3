"""`--baseline-url`: the same workload against another OpenAI-compatible server (a peer such as
faster-whisper-server, see scripts/peer_asr_server), alternated with the served runs in one bench run.

Each concurrency level runs `rounds` times as served, peer, served, peer, ... (every round sends all
prompts), so both servers see the same machine load; each server's records are pooled into one summary.
Around every run the bench also measures, per server:
- CPU seconds of the server's whole process tree (the process listening on the URL's port and all its
  descendants: for Omni-Triton the launcher with the frontend, tritonserver and every stub), from psutil,
  so `cpu_s_per_audio_s` is CPU time (not wall time) per second of audio (input audio for transcription,
  output audio otherwise). Only for servers on this machine; None elsewhere.
- `/health` latency, probed every HEALTH_PERIOD_S while the run goes (is the server responsive while busy?).
No model code.
"""
from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import httpx
import psutil

from omni_bench.metrics import stats
from omni_bench.runner import SendFn, run_level

HEALTH_PERIOD_S = 0.25


def listening_process(base_url: str) -> psutil.Process | None:
    """The local process listening on the URL's TCP port, or None (remote host, not found, no permission)."""
    parts = urlsplit(base_url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
    except psutil.Error:
        return None
    return None


def tree_cpu_s(process: psutil.Process | None) -> float | None:
    """User + system CPU seconds of `process` and its live descendants (None without a process)."""
    if process is None:
        return None
    total = 0.0
    for proc in [process, *process.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:  # exited meanwhile
            continue
    return total


async def _probe_health(client: httpx.AsyncClient, latencies: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        sent = time.perf_counter()
        try:
            await client.get("/health", timeout=30)
            latencies.append(time.perf_counter() - sent)
        except httpx.HTTPError:
            pass
        try:
            await asyncio.wait_for(stop.wait(), HEALTH_PERIOD_S)
        except asyncio.TimeoutError:
            pass


async def measured_run(send: SendFn, client: httpx.AsyncClient, prompts: list[str], process: psutil.Process | None,
                       *, num_warmups: int, **level) -> tuple[list, float, float | None, list[float]]:
    """`run_level` of `send` with the server's CPU seconds and /health latencies (through `client`) measured
    around its timed requests (warm-ups go first, unmeasured): (records, duration_s, cpu_s or None,
    health latencies in s)."""
    if num_warmups:
        await run_level(send, prompts[:num_warmups], max_concurrency=1, request_rate=float("inf"),
                        num_warmups=0, seed=0)
    latencies: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe_health(client, latencies, stop))
    before = tree_cpu_s(process)
    try:
        records, duration = await run_level(send, prompts, num_warmups=0, **level)
    finally:
        stop.set()
        await probe
    after = tree_cpu_s(process)
    return records, duration, (after - before if before is not None and after is not None else None), latencies


async def alternated(sides: list[tuple[SendFn, httpx.AsyncClient, psutil.Process | None]], prompts: list[str],
                     rounds: int, **level) -> list[tuple[list, float, float | None, list[float]]]:
    """Runs the level `rounds` times on each side (its send function, HTTP client for /health, server
    process) in turn (A, B, A, B, ...); per side the pooled records,
    the summed duration and CPU seconds (None if any run could not measure it) and all /health latencies.
    Warm-ups run in the first round only."""
    pooled: list[tuple[list, float, float | None, list[float]]] = [([], 0.0, 0.0, []) for _ in sides]
    for round_index in range(rounds):
        for i, (send, client, process) in enumerate(sides):
            warmups = level["num_warmups"] if round_index == 0 else 0
            records, duration, cpu, health = await measured_run(send, client, prompts, process,
                                                                **{**level, "num_warmups": warmups})
            old = pooled[i]
            pooled[i] = (old[0] + records, old[1] + duration,
                         None if old[2] is None or cpu is None else old[2] + cpu, old[3] + health)
    return pooled


def usage(records: list, cpu_s: float | None, health_s: list[float], workload: str) -> dict:
    """The `server_usage` entry of a level: CPU seconds, CPU seconds per audio second, /health latency stats."""
    ok = [r for r in records if r.ok]
    if workload == "transcription":
        audio_s = sum(r.input_audio_s or 0.0 for r in ok)
    else:
        audio_s = sum(r.audio_samples / r.sample_rate for r in ok if r.sample_rate)
    return {"cpu_s": cpu_s, "audio_s": audio_s,
            "cpu_s_per_audio_s": cpu_s / audio_s if cpu_s is not None and audio_s else None,
            "health_s": stats(health_s)}


def comparison(served: dict, peer: dict) -> dict:
    """Served vs peer at one level: medians of the latency metrics, throughput, CPU per audio second and the
    worst /health latency; each {served, baseline, ratio (served / baseline)}."""
    def pair(a, b):
        return {"served": a, "baseline": b, "ratio": a / b if a is not None and b else None}

    out = {}
    for name in ("ttft_s", "ttfp_s", "e2e_s", "rtf"):
        a, b = served["summary"]["metrics"].get(name), peer["summary"]["metrics"].get(name)
        if a and b:
            out[name] = pair(a["median"], b["median"])
    for name in ("request_throughput", "audio_seconds_per_s", "input_audio_seconds_per_s"):
        a, b = served["summary"]["throughput"][name], peer["summary"]["throughput"][name]
        if a or b:
            out[name] = pair(a, b)
    out["cpu_s_per_audio_s"] = pair(served["server_usage"]["cpu_s_per_audio_s"], peer["server_usage"]["cpu_s_per_audio_s"])
    health = [(u["server_usage"]["health_s"] or {}).get("p99") for u in (served, peer)]
    out["health_p99_s"] = pair(*health)
    return out


def comparison_table(comparison_by_level: list[tuple[int | None, dict]], peer_url: str) -> str:
    """The served/peer comparison of every level as text."""
    lines = [f"== served vs peer {peer_url} (alternated runs; medians, throughput, CPU-s per audio-s)"]
    for cap, found in comparison_by_level:
        lines.append(f"-- max_concurrency={cap or 'none'}")
        for name, c in found.items():
            fmt = (lambda v: "n/a" if v is None else f"{v:.4f}")
            ratio = "n/a" if c["ratio"] is None else f"{c['ratio']:.2f}x"
            lines.append(f"   {name:<28} served {fmt(c['served']):>10}  peer {fmt(c['baseline']):>10}  ratio {ratio:>7}")
    return "\n".join(lines)
