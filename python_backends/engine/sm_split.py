"""SM partitions for the engine threads of one process: CUDA green contexts, one per named engine.

The co-located layout runs the thinker's decode step and the talker's frame on two CUDA streams; with 16 rows
they barely overlap, because the thinker's MoE kernels occupy every SM and the talker's ~850 small,
latency-bound kernels queue behind them (docs/gpu.md, runs 22-24). A green context owns a disjoint set of
SMs: work launched into its streams runs on those SMs only, so two engines in two green contexts cannot
take each other's SMs.

`parse("thinker:96,talker:36")` reads the setting (`sm_split` of the co-located model: engine name, colon,
SM count; comma-separated; empty or "off": off). `partition(counts, device)` splits the device's SMs in that order
(the first engine gets the first `count` SMs, rounded up by the driver to its granularity, 8 on Hopper; the next
one `count` of the rest, or all of the rest when `count` is at least that; ...; an engine not named keeps the whole
device through the ordinary context). `within(part)` makes a partition the calling thread's for a
block: `new_stream()` then returns a stream of that green context, and `StepGraphs` captures its graphs on
such streams, so the kernels of its graphs run on the partition's SMs wherever the graph is replayed.

The driver calls go through ctypes to libcuda (cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc,
cuGreenCtxCreate, cuGreenCtxStreamCreate: CUDA >= 12.4 driver); torch's `torch.cuda.green_contexts` splits
every context from the first SMs (two of its contexts overlap) and gives no stream priority.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)
ENGINES = ("thinker", "talker", "code2wav")
_CU_DEV_RESOURCE_TYPE_SM = 1
_CU_GREEN_CTX_DEFAULT_STREAM = 1
_CU_STREAM_NON_BLOCKING = 1
# CUdevResource: type (4 bytes), 92 bytes the driver keeps, then the SM resource (smCount first); 144 bytes in
# CUDA 12.x, a few more in 13.x: one resource is given this much room
_RESOURCE_BYTES, _SM_COUNT_OFFSET = 512, 96
_local = threading.local()


def parse(text: str | None) -> dict[str, int]:
    """`"thinker:96,talker:36"` -> {"thinker": 96, "talker": 36} (order kept: the split's order); None or blank:
    {} (no partitions), as is "off". Raises ValueError naming the setting on an unknown or repeated engine (of
    ENGINES), a missing colon or a count that is not a positive integer."""
    counts: dict[str, int] = {}
    if (text or "").strip().lower() == "off":
        return counts
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, raw = item.partition(":")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in ENGINES:
            raise ValueError(f"sm_split: expected <engine>:<SMs> with engine one of {', '.join(ENGINES)}, "
                             f"got {item.strip()!r}")
        if name in counts:
            raise ValueError(f"sm_split: {name} given twice")
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"sm_split: {name}'s SM count must be a positive integer, got {raw!r}")
        counts[name] = int(raw)
    return counts


@dataclass(frozen=True)
class Partition:
    """One green context: `sms` SMs of `device` (the driver rounds a count up to its granularity, 8 on Hopper)."""

    name: str
    sms: int
    device: torch.device
    handle: int   # CUgreenCtx

    def stream(self, priority: int = 0) -> torch.cuda.ExternalStream:
        """A new non-blocking stream of this green context (priority: lower = higher, as torch.cuda.Stream's).
        Raises RuntimeError with the driver's message on failure."""
        stream = ctypes.c_void_p()
        _check(_driver().cuGreenCtxStreamCreate(ctypes.byref(stream), ctypes.c_void_p(self.handle),
                                                _CU_STREAM_NON_BLOCKING, priority), "cuGreenCtxStreamCreate")
        return torch.cuda.ExternalStream(stream.value, device=self.device)


def from_setting(text: str | None, device: torch.device | str) -> dict[str, Partition]:
    """The partitions of an `sm_split` setting on `device`: `partition(parse(text), device)` on CUDA; on another
    device the setting is only validated (a warning says it is ignored) and {} returned. Raises as those two."""
    counts = parse(text)
    if counts and torch.device(device).type != "cuda":
        log.warning("sm_split %r ignored: %s is not a CUDA device", text, device)
        return {}
    return partition(counts, device)


def partition(counts: dict[str, int], device: torch.device | str) -> dict[str, Partition]:
    """Green contexts of `counts` SMs each (`parse`'s result), disjoint, split off `device`'s SMs in order.

    Raises:
        ValueError: device is not CUDA, or the counts need more SMs than the device has.
        RuntimeError: the driver refused (message and driver call named), e.g. no green context support.
    """
    device = torch.device(device)
    if not counts:
        return {}
    if device.type != "cuda":
        raise ValueError(f"sm_split needs a CUDA device, got {device}")
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    total = torch.cuda.get_device_properties(index).multi_processor_count
    if sum(counts.values()) > total:
        raise ValueError(f"sm_split: {counts} needs {sum(counts.values())} SMs, {device} has {total}")
    torch.cuda.init()
    lib = _driver()
    dev = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    rest = ctypes.create_string_buffer(_RESOURCE_BYTES)
    _check(lib.cuDeviceGetDevResource(dev, rest, _CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    parts = {}
    for name, sms in counts.items():
        left = _sm_count(rest)
        if left == 0:
            raise ValueError(f"sm_split: no SMs left for {name} (the driver rounds counts up to its granularity)")
        if sms >= left:   # all that is left (the tail that is no multiple of the granularity, too)
            group, remaining = rest, ctypes.create_string_buffer(_RESOURCE_BYTES)
        else:
            group, remaining, groups = (ctypes.create_string_buffer(_RESOURCE_BYTES),
                                        ctypes.create_string_buffer(_RESOURCE_BYTES), ctypes.c_uint(1))
            _check(lib.cuDevSmResourceSplitByCount(group, ctypes.byref(groups), rest, remaining, 0, sms),
                   f"cuDevSmResourceSplitByCount({name}: {sms} of {left} SMs)")
            if groups.value != 1:
                raise RuntimeError(f"sm_split: {name}: {sms} of {left} SMs gave no group of that size")
        desc, green = ctypes.c_void_p(), ctypes.c_void_p()
        _check(lib.cuDevResourceGenerateDesc(ctypes.byref(desc), group, 1), "cuDevResourceGenerateDesc")
        _check(lib.cuGreenCtxCreate(ctypes.byref(green), desc, dev, _CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
        parts[name] = Partition(name, _sm_count(group), device, green.value)
        rest = remaining
    log.info("sm_split: %s of %d SMs on %s", ", ".join(f"{n} {p.sms}" for n, p in parts.items()), total, device)
    return parts


@contextlib.contextmanager
def within(part: Partition | None) -> Iterator[None]:
    """Make `part` the calling thread's partition for the block (None: the whole device): `new_stream()` and the
    graph captures of `StepGraphs` in the block use its SMs."""
    previous = getattr(_local, "part", None)
    _local.part = part
    try:
        yield
    finally:
        _local.part = previous


def current() -> Partition | None:
    """The calling thread's partition (`within`), None outside any."""
    return getattr(_local, "part", None)


def new_stream(device: torch.device | str | None = None, priority: int = 0) -> torch.cuda.Stream:
    """A new CUDA stream: of the calling thread's partition when it has one, else an ordinary one on `device`
    (None: the current device)."""
    part = current()
    if part is not None:
        return part.stream(priority)
    return torch.cuda.Stream(device, priority=priority)


def _sm_count(resource) -> int:
    return int.from_bytes(resource.raw[_SM_COUNT_OFFSET:_SM_COUNT_OFFSET + 4], "little")


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(result: int, call: str) -> None:
    if result != 0:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(result, ctypes.byref(text))
        raise RuntimeError(f"sm_split: {call} failed: CUDA error {result} "
                           f"({(text.value or b'unknown').decode()})")
