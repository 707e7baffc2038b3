"""CUDA-graph capture of fixed-shape step functions, one graph per bucket, with a clean eager fallback.

A decode step of a static-cache engine has the same shapes for every step of one batch bucket (the
batch padded to 1, 2, 4, ...; the attended cache columns padded to a length bucket). `StepGraphs`
captures `fn(**inputs)` once per bucket key into a `torch.cuda.CUDAGraph` (all graphs share one
memory pool) and afterwards only copies the new inputs into the captured input buffers and replays
the graph: one launch instead of the hundreds of kernel launches of a transformer step.

It falls back to calling `fn` eagerly, with the same results, when:
- the inputs are not CUDA tensors (CPU: graphs do not exist there) or graphs are disabled;
- capturing a bucket raises (e.g. an op that synchronises with the host): that bucket stays eager
  and the error is logged once and counted in `stats().failed`.

Captures run on streams of the SM partition (`sm_split.within`) of the thread that made the first capture:
its graphs' kernels then run on that partition's SMs wherever they are replayed.

`set_replay_timer(timer)` wraps every replay of every `StepGraphs` of the process in `timer(name)` (a context
manager; the step profile records CUDA events around each replay with it: `step_profile.GraphTimes`).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Hashable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from omni_backends.engine import sm_split

log = logging.getLogger(__name__)
# One capture at a time in the process: entering torch.cuda.graph synchronizes the device and empties the caching
# allocator, which invalidates a capture another thread has under way (the co-located layout's engines capture
# lazily, each in its own thread: "operation failed due to a previous error during capture" in some runs).
_CAPTURING = threading.RLock()

StepFn = Callable[..., tuple[torch.Tensor, ...]]
ReplayTimer = Callable[[str], AbstractContextManager]
_replay_timer: ReplayTimer | None = None


def set_replay_timer(timer: ReplayTimer | None) -> None:
    """Wrap every graph replay of the process in `timer(graph name)` from now on (None: plain replays)."""
    global _replay_timer
    _replay_timer = timer


@dataclass(frozen=True)
class GraphStats:
    """Counters of one StepGraphs: graphs captured, replays, eager calls, buckets whose capture failed."""

    captured: int
    replays: int
    eager: int
    failed: int


class _Graph:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: dict[str, torch.Tensor], outputs: tuple[torch.Tensor, ...]):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


def batch_bucket(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n. Raises ValueError when n exceeds the largest bucket."""
    for size in buckets:
        if size >= n:
            return size
    raise ValueError(f"{n} rows exceed the largest bucket {buckets[-1]}")


def power_of_two_buckets(limit: int, start: int = 1) -> tuple[int, ...]:
    """(start, 2*start, 4*start, ..., limit): the last bucket is `limit` itself (need not be a power of 2)."""
    if limit < 1 or start < 1:
        raise ValueError(f"bucket limit and start must be >= 1, got {limit=} {start=}")
    sizes, size = [], start
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


class StepGraphs:
    """Runs `fn(**inputs) -> tuple[Tensor, ...]`, replaying one captured CUDA graph per bucket key.

    Args:
        fn: the step; must only launch device work (no host synchronisation, no data-dependent
            Python branching, no allocation whose size depends on tensor values) and return a tuple
            of tensors. Tensors it reads other than its inputs (weights, KV caches) must keep their
            storage for the graph's lifetime.
        enabled: False: always eager.
        name: for logs.
        warmup: eager calls on a side stream before each capture (cuBLAS/Triton autotuning, lazy init).

    `run(key, inputs)` returns the graph's output tensors for a replayed bucket: they are overwritten
    by the next `run` of the same key, so copy (or consume) them first. Thread-safe per instance.
    """

    def __init__(self, fn: StepFn, *, enabled: bool = True, name: str = "step", warmup: int = 2):
        self.fn, self.enabled, self.name, self.warmup = fn, enabled, name, warmup
        self._graphs: dict[Hashable, _Graph] = {}
        self._eager_keys: set[Hashable] = set()
        self._pool = self._capture_stream = self._warmup_stream = None
        self._lock = threading.Lock()
        self._replays = self._eager = self._failed = 0

    def stats(self) -> GraphStats:
        return GraphStats(captured=len(self._graphs), replays=self._replays, eager=self._eager, failed=self._failed)

    def captured(self, key: Hashable) -> bool:
        """True when `key` has a captured graph."""
        return key in self._graphs

    def run(self, key: Hashable, inputs: Mapping[str, torch.Tensor],
            constant: Collection[str] = ()) -> tuple[torch.Tensor, ...]:
        """`fn(**inputs)`: replayed from the bucket's graph when possible (see class doc). `constant`: names of
        inputs that are the same in every run of `key` (e.g. a range the key determines): copied into the graph's
        buffers at capture only, not before each replay (one copy launch less each)."""
        with self._lock:
            if not self._graphable(inputs) or key in self._eager_keys:
                self._eager += 1
                return self.fn(**inputs)
            graph = self._graphs.get(key) or self._capture(key, inputs)
            if graph is None:
                self._eager += 1
                return self.fn(**inputs)
            for name, value in inputs.items():
                if name not in constant:
                    graph.inputs[name].copy_(value, non_blocking=True)
            if (timer := _replay_timer) is None:
                graph.graph.replay()
            else:
                with timer(self.name):
                    graph.graph.replay()
            self._replays += 1
            return graph.outputs

    def _graphable(self, inputs: Mapping[str, torch.Tensor]) -> bool:
        return self.enabled and torch.cuda.is_available() and all(t.is_cuda for t in inputs.values())

    def _capture(self, key: Hashable, inputs: Mapping[str, torch.Tensor]) -> _Graph | None:
        with _CAPTURING:
            return self._capture_alone(key, inputs)

    def _capture_alone(self, key: Hashable, inputs: Mapping[str, torch.Tensor]) -> _Graph | None:
        static = {name: value.clone() for name, value in inputs.items()}
        try:
            if self._warmup_stream is None:   # streams of the caller's SM partition at the first capture, if any
                self._warmup_stream, self._capture_stream = sm_split.new_stream(), sm_split.new_stream()
            stream = self._warmup_stream
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(self.warmup):
                    self.fn(**static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            # thread_local: other threads of the process (response senders, the other engines of the
            # co-located layout) may use the GPU during a capture; each StepGraphs captures on its own stream
            # (torch's default capture stream is one per process: two engines capturing at once would collide)
            with torch.cuda.graph(graph, pool=self._pool, stream=self._capture_stream,
                                  capture_error_mode="thread_local"):
                outputs = self.fn(**static)
        except Exception as exc:  # noqa: BLE001 - any capture failure: this bucket runs eagerly
            self._failed += 1
            self._eager_keys.add(key)
            log.warning("%s: CUDA graph capture of bucket %s failed, running it eagerly: %s", self.name, key, exc)
            # Only this object's streams are waited for: a device-wide synchronize would break a capture that another
            # thread (another engine of the co-located layout) has under way. A capture that failed at its end leaves
            # torch's allocator recording into its pool ("beginAllocateToPool: already recording to mempool_id" for
            # every later capture with it), so the next bucket captures into a fresh pool on a fresh stream.
            for side in (self._warmup_stream, self._capture_stream):
                if side is not None:
                    side.synchronize()
            self._pool = self._capture_stream = self._warmup_stream = None
            return None
        self._graphs[key] = _Graph(graph, static, tuple(outputs))
        log.info("%s: captured CUDA graph for bucket %s", self.name, key)
        return self._graphs[key]
