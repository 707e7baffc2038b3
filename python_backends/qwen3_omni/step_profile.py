"""Step profile: where the co-located pipeline's steady state goes, per engine thread (issue 9's RTF at c=16).

`LocalOmniPipeline(profile=StepProfile(...))` reports every iteration of its engine threads here:
  thinker   each engine-loop forward (`EngineLoop.observe`): "thinker_decode" / "thinker_prefill", its wall time
            (forward, sampling, the tokens handed to the requests), the requests still running after it
  talker    each `StageThread` iteration: the time blocked on its inbox (waiting for text or frames: `wait`),
            applying messages (`apply`: the spoken tokens' embedding lookup and projection), and its step
            (`work`: prefill + one frame of every request that has text), with the frames it made
  code2wav  the same: wait / apply / decode of every ready chunk, with the chunks it decoded
Each record also has the thread's CPU time since its previous record (`time.thread_time()`: running Python, or a
CUDA synchronisation spinning; a thread blocked on the GIL or a lock uses none) and `live`: the requests with a
voice in the pipeline (c=16's steady state is `live=16`).
On CUDA each record also carries `gpu_ms`: the device time of the thread's CUDA-graph replays (a CUDA event before
and after each replay, recorded without synchronising: `GraphTimes`), and `gpu_<graph>=` per graph name (talker,
code_predictor, thinker, ...), so `wall - gpu` is the iteration's time outside its graphs (host work, eager launches,
waits). An event pair is read once both events completed, at the thread's next record after that: a step's replays
that are still running when it records (the talker launches its next decoder step before it returns) count in the
next record, which in the steady state moves time between neighbouring records, not out of the medians.
A probe thread wakes every `PROBE_S` and records how late it got the GIL back (`gil` records: the wait any
thread sees after a torch call or a sleep), and every `SNAPSHOT_S` the CPU seconds of every thread of the
process (the request coroutines run on Triton's asyncio thread).

The records go to a file (the served model: environment variable `OMNI_STEP_LOG=FILE`), one line each
(`step stage=talker t=... wall_ms=... wait_ms=... apply_ms=... work_ms=... cpu_ms=... rows=16 live=16`).
`python -m omni_backends.qwen3_omni.step_profile FILE --live 16` prints the per-stage table of the records made with
exactly that many live requests.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import torch

from omni_backends.engine import graphs

PROBE_S = 0.002      # seconds the GIL probe sleeps between wake-ups
SNAPSHOT_S = 0.25    # seconds between per-thread CPU snapshots (and file flushes)
_FIELD = re.compile(r"(\w+)=(\S+)")


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by each thread of this process, from /proc (Linux; empty elsewhere):
    Python threads by name (threads sharing a name summed), threads Python did not start (the stub's, CUDA's, the
    asyncio loop's when a foreign thread runs it) as `tid<N>`."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    try:
        tids = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        name = names.get(tid, f"tid{tid}")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class GraphTimes:
    """Device time of CUDA-graph replays per calling thread: `with times(name):` around a replay records a CUDA event
    before and after it on the current stream (no synchronisation); `drain()` returns the milliseconds of the
    calling thread's replays whose events have completed since its last drain, per graph name. Thread-safe."""

    def __init__(self):
        self._local = threading.local()

    def _pending(self) -> list:
        if not hasattr(self._local, "pending"):
            self._local.pending = []
        return self._local.pending

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending().append((name, start, end))

    def drain(self) -> dict[str, float]:
        """{graph name: ms} of the calling thread's completed replays not drained before (names with '-' as '_')."""
        pending, out, left = self._pending(), {}, []
        for name, start, end in pending:
            if end.query():
                key = name.replace("-", "_")
                out[key] = out.get(key, 0.0) + start.elapsed_time(end)
            else:
                left.append((name, start, end))
        pending[:] = left
        return out


class StepProfile:
    """Collects the engine threads' step records (module doc). Thread-safe.

    Args:
        path: file the records are appended to, one line each.

    Attribute `live`: returns the requests with a voice now in the pipeline (`LocalOmniPipeline` sets it).
    While open it times every CUDA-graph replay of the process (`graphs.set_replay_timer`; one profile per process).
    """

    def __init__(self, path: str):
        self.live: Callable[[], int] = lambda: 0
        self.graph_times = GraphTimes()
        graphs.set_replay_timer(self.graph_times if torch.cuda.is_available() else None)
        self._file = open(path, "a", buffering=1 << 16)
        self._lock = threading.Lock()
        self._cpu = threading.local()
        self._closed = threading.Event()
        threading.Thread(target=self._probe, name="omni-step-probe", daemon=True).start()

    def _thread_cpu_ms(self) -> float:
        """CPU milliseconds of the calling thread since its previous record."""
        now = time.thread_time()
        last = getattr(self._cpu, "last", now)
        self._cpu.last = now
        return (now - last) * 1e3

    def thinker(self, phase: str, seconds: float, rows: int) -> None:
        """One thinker engine-loop forward that just ended (phase "prefill" / "decode")."""
        self._record(f"thinker_{phase}", seconds, rows, {})

    def stage(self, stage: str, wait: float, apply: float, work: float, rows: int) -> None:
        """One iteration of a stage thread that just ended: seconds blocked on its inbox, applying messages and in
        its step; rows: the frames or chunks the step made (0: it only applied messages)."""
        self._record(stage, wait + apply + work, rows, {"wait_ms": wait * 1e3, "apply_ms": apply * 1e3,
                                                        "work_ms": work * 1e3})

    def _record(self, stage: str, seconds: float, rows: int, parts: dict[str, float]) -> None:
        cpu = self._thread_cpu_ms()
        gpu = self.graph_times.drain() if torch.cuda.is_available() else {}
        if gpu:
            parts = {**parts, "gpu_ms": sum(gpu.values()), **{f"gpu_{k}": v for k, v in sorted(gpu.items())}}
        extra = "".join(f" {k}={v:.3f}" for k, v in parts.items())
        line = (f"step stage={stage} t={time.monotonic():.6f} wall_ms={seconds * 1e3:.3f}{extra} cpu_ms={cpu:.3f} "
                f"rows={rows} live={self.live()}\n")
        with self._lock:
            if not self._file.closed:
                self._file.write(line)

    def _probe(self) -> None:
        last_snapshot = 0.0
        while not self._closed.is_set():
            before = time.monotonic()
            time.sleep(PROBE_S)
            now = time.monotonic()
            lines = [f"gil t={now:.6f} late_ms={(now - before - PROBE_S) * 1e3:.3f} live={self.live()}\n"]
            if now - last_snapshot >= SNAPSHOT_S:
                last_snapshot = now
                cpu = " ".join(f"{name.replace(' ', '_')}={s:.2f}" for name, s in sorted(thread_cpu_seconds().items()))
                lines.append(f"threads t={now:.6f} live={self.live()} {cpu}\n")
            with self._lock:
                if self._file.closed:
                    return
                self._file.writelines(lines)
                if len(lines) > 1:
                    self._file.flush()

    def close(self) -> None:
        """Stop the probe and the replay timing and close the file."""
        graphs.set_replay_timer(None)
        self._closed.set()
        with self._lock:
            self._file.close()


def _records(lines: Iterable[str]) -> Iterable[tuple[str, dict[str, str]]]:
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        if kind in ("step", "gil", "threads"):
            yield kind, dict(_FIELD.findall(rest))


def _median_p90(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{statistics.median(ordered):.2f} / {ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]:.2f}"


def summarize(lines: Iterable[str], live: int) -> str:
    """The per-stage table of the records made with exactly `live` requests in the pipeline: per stage the
    steps, rows per step, steps per second, wall / wait / apply / work / CPU / GPU ms per step (median / p90; GPU:
    the graph replays' device time, "-" without it) and the share of the window in work; the GPU ms per graph
    (median over the records that have it); the GIL probe's lateness; each thread's CPU seconds per second of the
    window."""
    steps: dict[str, list[dict[str, str]]] = {}
    late, snapshots = [], []
    for kind, fields in _records(lines):
        if int(fields.get("live", 0)) != live:
            continue
        if kind == "step":
            steps.setdefault(fields["stage"], []).append(fields)
        elif kind == "gil":
            late.append(float(fields["late_ms"]))
        else:
            snapshots.append(fields)
    times = [float(f["t"]) for records in steps.values() for f in records]
    if not times:
        return f"no step records with live = {live}"
    # the window: only spans of consecutive records (a gap over 0.5 s: between benchmark levels)
    times.sort()
    window = sum(b - a for a, b in zip(times, times[1:]) if b - a < 0.5)
    out = [f"steady state with {live} live requests: {window:.2f} s of records",
           "| stage | steps | rows/step | steps/s | wall ms | wait ms | apply ms | work ms | CPU ms | GPU ms | work share |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    columns = ("wall_ms", "wait_ms", "apply_ms", "work_ms", "cpu_ms", "gpu_ms")
    per_graph = []
    for stage, records in sorted(steps.items()):
        worked = [r for r in records if int(r["rows"])]
        col = {k: [float(r[k]) for r in records if k in r] for k in columns}
        work_s = sum(col["work_ms"] or col["wall_ms"]) / 1e3
        rows = statistics.mean(int(r["rows"]) for r in worked) if worked else 0.0
        out.append(f"| {stage} | {len(worked)} | {rows:.1f} | {len(worked) / window:.1f} | "
                   + " | ".join(_median_p90(col[k]) for k in columns) + f" | {work_s / window:.0%} |")
        names = sorted({k for r in records for k in r if k.startswith("gpu_") and k != "gpu_ms"})
        if names:
            per_graph.append(f"{stage}: " + ", ".join(
                f"{k[4:]} {statistics.median(float(r[k]) for r in records if k in r):.2f}" for k in names))
    if per_graph:
        out.append("GPU ms per record by graph (median of the records with it): " + "; ".join(per_graph))
    out.append(f"GIL probe ({PROBE_S * 1e3:g} ms sleeps): late by {_median_p90(late)} ms (median / p90), "
               f"max {max(late, default=0):.2f} ms, {len(late)} wake-ups")
    if len(snapshots) >= 2:
        first, last = snapshots[0], snapshots[-1]
        span = float(last["t"]) - float(first["t"])
        rates = {k: (float(v) - float(first.get(k, 0))) / span for k, v in last.items()
                 if k not in ("t", "live") and span > 0}
        busy = ", ".join(f"{k} {v:.2f}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v >= 0.02)
        out.append(f"thread CPU (s per s, {span:.2f} s): {busy}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-stage table of a step profile log (OMNI_STEP_LOG).")
    parser.add_argument("log", help="the file OMNI_STEP_LOG named")
    parser.add_argument("--live", type=int, nargs="+", default=[16],
                        help="a table of the records made with exactly this many live requests (one per value)")
    args = parser.parse_args(argv)
    with open(args.log) as f:
        lines = f.readlines()
    for live in args.live:
        print(summarize(lines, live))
    return 0


if __name__ == "__main__":
    sys.exit(main())
