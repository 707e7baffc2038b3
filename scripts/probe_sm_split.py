#!/usr/bin/env python
"""Do CUDA green contexts (`engine.sm_split`) work on this machine, and do CUDA graphs keep their SM limit?

    python scripts/probe_sm_split.py [--sms 16] [--json out.json]

Splits off a partition of `--sms` SMs (the rest a second partition) and times, by CUDA events (median of 20 after 3
warm-ups), a compute-bound bf16 matrix product (8192^3: bound by SMs, so its time should grow ~ device SMs /
partition SMs) and a memory-bound 2 GiB copy:
  whole        an ordinary stream
  part         a stream of the partition (eager launches)
  part_graph   a CUDA graph captured on a partition stream, replayed on an ordinary stream
  graph_part   a CUDA graph captured on an ordinary stream, replayed on a partition stream
and checks that a Triton kernel launched on a partition stream computes the right result and that streams of the
two partitions and an ordinary one order each other (`wait_stream`: events across contexts). Prints a table; exit 1
when something fails.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch


def timed_ms(fn, stream, repeats: int = 20) -> float:
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def captured(fn, stream) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph


def triton_add_ok(stream) -> bool:
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, out_ptr, n, block: tl.constexpr):
        offsets = tl.program_id(0) * block + tl.arange(0, block)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
                 mask=mask)

    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    out = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        add[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), block=1024)
    stream.synchronize()
    return torch.equal(out, x + y)


def ordering_ok(first, second) -> bool:
    """A long write on `first`, then a read on `second` after `second.wait_stream(first)`."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with torch.cuda.stream(first):
        product = a @ a
    second.wait_stream(first)
    with torch.cuda.stream(second):
        total = product.float().sum()
    second.synchronize()
    return bool(torch.isclose(total, (a @ a).float().sum(), rtol=1e-3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from omni_backends.engine import sm_split

    total = torch.cuda.get_device_properties(0).multi_processor_count
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "sms": total}
    try:
        parts = sm_split.partition({"thinker": args.sms, "talker": total - args.sms},
                                   "cuda:0")
    except (RuntimeError, ValueError) as exc:
        print(f"green contexts: FAILED: {exc}")
        result["error"] = str(exc)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 1
    small, rest = parts["thinker"], parts["talker"]
    result["partitions"] = {"small": small.sms, "rest": rest.sms}
    print(f"green contexts: {total} SMs -> partitions of {small.sms} and {rest.sms} SMs")
    ordinary, in_part = torch.cuda.Stream(), small.stream()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(1 << 29, device="cuda")   # 2 GiB
    dst = torch.empty_like(src)
    work = {"matmul_8192": lambda: a @ a, "copy_2GiB": lambda: dst.copy_(src)}
    times = {}
    for name, fn in work.items():
        graph_in_part, graph_whole = captured(fn, in_part), captured(fn, ordinary)
        times[name] = {"whole": timed_ms(fn, ordinary), "part": timed_ms(fn, in_part),
                       "part_graph": timed_ms(graph_in_part.replay, ordinary),
                       "graph_part": timed_ms(graph_whole.replay, in_part)}
        print(f"{name:12s} " + "  ".join(f"{k} {v:7.3f} ms" for k, v in times[name].items()), flush=True)
    result["times_ms"] = times
    checks = {"triton_on_partition": triton_add_ok(in_part),
              "order_partition_to_partition": ordering_ok(in_part, rest.stream()),
              "order_partition_to_ordinary": ordering_ok(in_part, ordinary),
              "order_ordinary_to_partition": ordering_ok(ordinary, in_part)}
    result["checks"] = checks
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
