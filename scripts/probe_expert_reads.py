#!/usr/bin/env python3
"""The least time a batch of concurrent Qwen3-Omni requests can take on this device: experts read per decode step.

Issue 9's c=16 workload (128 thinker tokens + 125 codec frames = 10 s of speech per request, 16 requests at once)
is bounded by HBM bandwidth whatever the kernels do: each thinker decode step must read, in every sparse layer, the
union of the experts its rows were routed to, and a step cannot start before the one before it ends. This probe
measures that union. The thinker decodes `--requests` chat prompts (the bench's built-in prompts in the served chat
template) together, greedily, with transformers' `generate` (a left-padded batch, eager: routing is the model's, not
our kernels'); a hook on every sparse layer's router records its top-k expert ids at each decode step. For each
concurrency c in `--batches` (the first c rows of the batch):

- per step and layer: distinct experts over the c rows (at c=1: exactly top-k);
- per step: the weight bytes the step must read at least: `bench_engine.active_bytes` with the top-k experts
  replaced by that union, plus c embedding rows and the rows' KV cache;
- thinker floor = sum over steps of bytes / bandwidth; talker floor = `--frames` x the talker's least bytes per
  frame (attention, router, shared expert and one row's top-k experts in each layer, the codec head, and the code
  predictor's `num_code_groups - 1` passes) / bandwidth; code2wav and the prefills are left out, so the sum is a
  lower bound;
- RTF floor = (thinker floor + talker floor) / (frames x 80 ms of speech).

Bandwidths: the device-to-device copy measured in the same run (read + write counted: `bench_engine.bandwidth`) and
`--peak-tbs` (the H200's data-sheet 4.8 TB/s), so the floor holds even for a kernel that streamed faster than a copy.
Prints a table; `--json` writes every step's counts. Runs on CPU too (a tiny checkpoint; no measured bandwidth).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import active_bytes, attention_params, bandwidth, checkpoint_path, kv_bytes  # noqa: E402

FRAME_SECONDS = 0.08   # one codec frame at 12.5 Hz


def thinker_prompts(path: Path, config, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` of the bench's built-in prompts as the served thinker sees them, left-padded: (ids, mask) int64 [count, L]."""
    from transformers import AutoTokenizer, WhisperFeatureExtractor

    from omni_backends.qwen3_omni.prompt import PromptBuilder
    from omni_bench.datasets import BUILTIN_PROMPTS

    builder = PromptBuilder(AutoTokenizer.from_pretrained(path), WhisperFeatureExtractor.from_pretrained(path),
                            config.thinker_config.audio_config.n_window)
    texts = [BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)] for i in range(count)]
    rows = [builder.build([{"role": "user", "content": t}]).input_ids for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.zeros(count, width, dtype=torch.long)
    mask = torch.zeros(count, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def record_routes(model, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy batched decode of `steps` steps after the prefill: int64 [steps, layers, rows, top_k], the experts each
    row was routed to in each sparse layer (hooks on the routers; the prefill's calls are skipped)."""
    routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate") and hasattr(m, "top_k")]
    if not routers:
        raise RuntimeError("no top-k routers (`*.mlp.gate` with `top_k`) in the thinker")
    rows, records = ids.shape[0], []

    def hook(module, inputs, output):
        tokens = inputs[0].reshape(-1, inputs[0].shape[-1]).shape[0]
        if tokens == rows:   # a decode step: one token per row
            picked = output[-1] if isinstance(output, tuple) else output.topk(module.top_k, dim=-1).indices
            records.append(picked.detach().to("cpu", torch.long))

    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps + 1, min_new_tokens=steps + 1,
                       do_sample=False, pad_token_id=0)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(records).reshape(steps, len(routers), rows, -1)


def distinct_experts(routes: torch.Tensor, rows: int) -> torch.Tensor:
    """int64 [steps, layers]: distinct experts over the first `rows` rows of `routes` [steps, layers, R, k]."""
    steps, layers = routes.shape[:2]
    picked = routes[:, :, :rows].reshape(steps, layers, -1)
    hits = torch.zeros(steps, layers, int(routes.max()) + 1, dtype=torch.bool)
    hits.scatter_(2, picked, True)
    return hits.sum(-1)


def thinker_step_bytes(text, distinct: list[int], contexts: list[int], element_size: int = 2) -> int:
    """Least bytes one thinker decode step reads: `active_bytes` with each layer's top-k experts replaced by
    `distinct[layer]` experts, one embedding row per request, and the KV of each request's `contexts` tokens."""
    expert = 3 * text.hidden_size * text.moe_intermediate_size
    extra_experts = sum(distinct) - text.num_hidden_layers * text.num_experts_per_tok
    return (active_bytes(text, element_size) + element_size * (extra_experts * expert
            + (len(contexts) - 1) * text.hidden_size) + sum(kv_bytes(text, n, element_size) for n in contexts))


def dense_layer_params(cfg) -> int:
    """Parameters of one dense decoder layer (attention, gated MLP, two norms)."""
    return attention_params(cfg) + 3 * cfg.hidden_size * cfg.intermediate_size + 2 * cfg.hidden_size


def talker_frame_bytes(talker_config, element_size: int = 2) -> int:
    """Least bytes one talker frame reads at any batch: the talker step with one row's top-k experts and its shared
    expert (`active_bytes` + shared expert + its gate per layer), then the code predictor's `num_code_groups - 1`
    passes (its layers and one codebook head each)."""
    text, predictor = talker_config.text_config, talker_config.code_predictor_config
    shared = text.num_hidden_layers * (3 * text.hidden_size * text.shared_expert_intermediate_size + text.hidden_size)
    per_pass = predictor.num_hidden_layers * dense_layer_params(predictor) + predictor.vocab_size * predictor.hidden_size
    passes = talker_config.num_code_groups - 1
    return active_bytes(text, element_size) + element_size * (shared + passes * per_pass)


def floors(routes: torch.Tensor, config, prompt_lengths: list[int], batches: list[int], frames: int,
           bandwidths: dict[str, float]) -> list[dict]:
    """Per concurrency: distinct-expert statistics, bytes per step, and the floors (seconds) per bandwidth."""
    text = config.thinker_config.text_config
    talker = talker_frame_bytes(config.talker_config)
    steps = routes.shape[0]
    out = []
    for c in batches:
        distinct = distinct_experts(routes, c)
        step_bytes = [thinker_step_bytes(text, distinct[s].tolist(), [n + s + 1 for n in prompt_lengths[:c]])
                      for s in range(steps)]
        flat = distinct.flatten().tolist()
        entry = {"concurrency": c, "steps": steps, "frames": frames,
                 "distinct_experts_per_layer": {"median": statistics.median(flat), "min": min(flat), "max": max(flat),
                                                "mean": sum(flat) / len(flat)},
                 "distinct_experts": distinct.tolist(), "thinker_bytes_per_step_median": statistics.median(step_bytes),
                 "talker_bytes_per_frame": talker, "floors": {}}
        for name, bw in bandwidths.items():
            thinker_s, talker_s = sum(step_bytes) / bw, frames * talker / bw
            entry["floors"][name] = {"bytes_per_s": bw, "thinker_s": thinker_s, "talker_s": talker_s,
                                     "rtf": (thinker_s + talker_s) / (frames * FRAME_SECONDS)}
        out.append(entry)
    return out


def print_table(results: list[dict]) -> None:
    names = list(results[0]["floors"])
    print("| c | distinct experts per layer: median (min-max) | thinker GB per step | "
          + " | ".join(f"thinker / talker floor, RTF floor at {n}" for n in names) + " |")
    print("|---" * (3 + len(names)) + "|")
    for r in results:
        d = r["distinct_experts_per_layer"]
        cells = [f"{f['thinker_s'] * 1e3:.0f} / {f['talker_s'] * 1e3:.0f} ms, **{f['rtf']:.3f}**"
                 for f in r["floors"].values()]
        print(f"| {r['concurrency']} | {d['median']:g} ({d['min']}-{d['max']}) | "
              f"{r['thinker_bytes_per_step_median'] / 1e9:.2f} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="qwen3_omni_30b_a3b_random", help="preset name or directory")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--requests", type=int, default=16, help="prompts decoded together (the largest concurrency)")
    parser.add_argument("--steps", type=int, default=128, help="thinker decode steps (issue 9: 128 tokens)")
    parser.add_argument("--frames", type=int, default=125, help="codec frames per request (issue 9: 125 = 10 s)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="concurrencies to report")
    parser.add_argument("--peak-tbs", type=float, default=4.8, help="data-sheet HBM bandwidth, TB/s")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if max(args.batches) > args.requests:
        parser.error("--batches may not exceed --requests")
    from omni_backends.qwen3_omni.loading import load_config, load_thinker

    path = checkpoint_path(args.checkpoint)
    if path is None:
        return 1
    config = load_config(path)
    bandwidths = {"peak": args.peak_tbs * 1e12}
    if args.device.startswith("cuda"):
        bandwidths["copy"] = bandwidth(args.device)
    ids, mask = thinker_prompts(path, config, args.requests)
    with torch.inference_mode():
        model = load_thinker(path, config, args.device)
        routes = record_routes(model, ids.to(args.device), mask.to(args.device), args.steps)
    results = floors(routes, config, mask.sum(-1).tolist(), args.batches, args.frames, bandwidths)
    print_table(results)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"checkpoint": str(path), "device": args.device, "results": results}))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
