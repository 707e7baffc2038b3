#!/usr/bin/env python
"""Measure the Qwen3-Omni decode engines in-process against the memory-bandwidth floor (prints, writes JSON).

    python scripts/bench_engine.py --checkpoint qwen3_omni_30b_a3b_random --device cuda --json var/bench/engine.json

  bandwidth  device-to-device copy of 2 GiB: (bytes read + written) / time, the HBM ceiling of this run
  thinker    decode step of the static engine (`StaticDecoder`) at batch 1, 4, 16: CUDA graphs vs eager,
             omni_kernels on vs off (when available), and the kernels with one switch changed (`--modes`, MODES:
             on_no_pdl, on_prefetch, on_prefetch_linear, on_torch_linears, on_main = both of the last off, on_rows16,
             on_unfused_step, on_unfused_attention, on_tuned / on_tuned_torch_head = the decode tiles of a
             `bench_kernels --tune-decode` JSON given as --tables, with the lm_head's tile / torch's,
             on_full_inputs = the step's host work as before run 16, on_full_frame = the talker frame graph's per-step
             tables as before run 23, on_pdl16 / on_rows16_pdl16 = PDL launches up to 16 rows, with decode_linear
             too, on_rows16_pdl16_tile16k = the split-K finish in tiles of 16384 elements,
             on_rows16_pdl16_row_finish = the split-K finish one row at a time, on_rows16_pdl16_tuned = --tables' tiles
             (e.g. `bench_kernels --tune-decode --linear-rows 16`) with decode_linear to 16 rows, on_full_steps = the frame graph's
             first predictor step whole and its picks as arg-max + embedding, both as before run 29); with --rounds N
             every mode is timed N times, modes interleaved (the machine's speed drifts), medians reported; the
             floor = (active weight bytes + KV bytes of the step) / measured bandwidth; greedy tokens of a fixed
             (seeded) prompt per mode, and each mode's logits over the same 32
             tokens (kernels-off's) against kernels-off's (relative / absolute difference, argmax flips and
             whether they are near-ties of the random model); with --profile, each graph mode's kernels at
             batch 1 (torch.profiler over 20 replays: us per step by kernel, and the time between kernels)
  talker     frame time = talker decode step + the frame graph (code 0, the 15-step code predictor), static engine
             (graphs) vs transformers' forward with a DynamicCache (the "dynamic" engine), batch 1 and 16
             (--distinct-rows: each row its own input, so the MoE reads each row's experts); per mode and batch the
             codes of 4 greedy frames from the same state and their agreement with the first mode's; --profile
             breaks the frame down by kernel at --profile-batches
  overlap    thinker steps and talker frames at once on two threads / CUDA streams (the co-located
             layout) vs one after the other on one stream, batch 1 and 16 (CUDA only); per --sm-splits setting
             (`engine.sm_split`, e.g. thinker:96,talker:36: each engine's stream and graphs in a green context of
             that many SMs; off: the whole device), engines and graphs made anew for each
  pipeline   the co-located pipeline in-process (`LocalOmniPipeline`: thinker, talker and code2wav threads on
             their own streams, no Triton) with the served bench's request (128 tokens, 125 codec frames,
             greedy) at concurrency 1 and 16: wall time, RTF, ms per frame, and the CPU time of each engine
             thread (a thread near 100% of the wall time is host-bound; CUDA synchronisations spin, so GPU waits
             count too), per Python thread switch interval (--pipeline-switch-ms; not part of the default parts)
Timings are medians of CUDA-event timed calls after warm-up; each call includes its host work (input
copies, graph launch), as in serving. The random preset is prepared when missing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch


def timed_ms(fn, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over `repeats` calls (CUDA events on CUDA, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bandwidth(device: str) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    if not device.startswith("cuda"):
        return float("nan")
    src = torch.empty(2**30, dtype=torch.float16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() * src.element_size() / (ms / 1e3)


def head_dim(text_config) -> int:
    return getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads


def attention_params(config) -> int:
    """Parameters of one decoder layer's attention: the q/k/v/o projections and the q/k norms."""
    h, d = config.hidden_size, head_dim(config)
    return 2 * h * config.num_attention_heads * d + 2 * h * config.num_key_value_heads * d + 2 * d


def active_bytes(text_config, element_size: int = 2) -> int:
    """Weight bytes one decode token reads: embedding row, per layer attention + norms + router + top-k
    experts, final norm, lm_head."""
    h = text_config.hidden_size
    attn = attention_params(text_config)
    moe = text_config.num_experts * h + text_config.num_experts_per_tok * 3 * h * text_config.moe_intermediate_size
    per_layer = attn + moe + 2 * h
    return element_size * (h + text_config.num_hidden_layers * per_layer + h + text_config.vocab_size * h)


def kv_bytes(text_config, length: int, element_size: int = 2) -> int:
    return element_size * 2 * text_config.num_hidden_layers * text_config.num_key_value_heads * length * \
        head_dim(text_config)


# The A/B modes of the thinker and talker parts: each the default engine ("on") with some switches changed.
DEFAULT_MODE = {"kernels": True, "fused_attention": True, "step_fusion": True, "pdl": True, "prefetch": False,
                "direct_decode_linear": True, "linear_rows": 4, "tables": "checked_in", "decode_head": True,
                "lean_inputs": True, "lean_frame": True, "lean_steps": True, "pdl_rows": 4, "finish_tile": 4096}
MODES = {
    "off": {"kernels": False},                                  # transformers' modules (grouped_mm MoE)
    "on": {},
    "on_no_pdl": {"pdl": False},                                # plain launches (no programmatic dependent launch)
    "on_prefetch": {"prefetch": True},                          # decode_linear pulls its weights into L2 first,
    "on_prefetch_linear": {"prefetch": "decode_linear"},        # the MoE its W2 columns; or decode_linear only
    "on_torch_linears": {"direct_decode_linear": False},        # q/k/v, gate/up through torch's linear
    "on_main": {"pdl": False, "direct_decode_linear": False},   # the kernels as before PDL and direct stores
    "on_rows1": {"linear_rows": 1, "pdl_rows": 1},              # decode_linear and PDL at one row only (before run 30)
    "on_rows16": {"linear_rows": 16},                           # decode_linear (+ norm epilogues) up to 16 rows
    "on_unfused_step": {"step_fusion": False},                  # separate norms, torch router, four-launch MoE
    "on_unfused_attention": {"fused_attention": False},         # norms + RoPE + cache writes + SDPA
    "on_tuned": {"tables": "tuned"},                            # the decode tiles of --tables (a tune-decode JSON)
    "on_tuned_torch_head": {"tables": "tuned", "decode_head": False},   # same, lm_head through torch's linear
    "on_full_inputs": {"lean_inputs": False},                   # the thinker step pads and copies every input
    "on_full_frame": {"lean_frame": False},                     # the frame graph builds positions / RoPE rows per step
    "on_pdl16": {"pdl_rows": 16},                               # PDL launches up to 16 rows (attention, norms, silu)
    "on_rows16_pdl16": {"linear_rows": 16, "pdl_rows": 16},     # and decode_linear up to 16 rows: Triton + PDL chains
    "on_full_steps": {"lean_steps": False},                     # the frame's step 0 whole, arg-max + embedding apart
    "on_rows16_pdl16_tile16k": {"linear_rows": 16, "pdl_rows": 16, "finish_tile": 16384},   # 16 rows of 1024 at once
    "on_rows16_pdl16_tuned": {"linear_rows": 16, "pdl_rows": 16, "tables": "tuned"},   # with --tables' tiles (e.g. 16 rows)
    "on_rows16_pdl16_row_finish": {"linear_rows": 16, "pdl_rows": 16, "finish_tile": 0},   # split-K finish row by row
}


def set_mode(name: str) -> None:
    """Switch the engine's kernel options to mode `name` (read at graph capture and at each eager call)."""
    import omni_kernels

    from omni_backends.engine import fused
    from omni_backends.qwen3_omni import decoder, talker_static

    mode = {**DEFAULT_MODE, **MODES[name]}
    decoder.set_lean_inputs(mode["lean_inputs"])
    talker_static.set_lean_frame(mode["lean_frame"])
    talker_static.set_lean_steps(mode["lean_steps"])
    omni_kernels.backend.PDL_MAX_ROWS = mode["pdl_rows"]
    omni_kernels.splitk.FINISH_TILE = mode["finish_tile"]
    use_tables(_tuned_tables if mode["tables"] == "tuned" else None, mode["decode_head"])
    fused.set_enabled(mode["kernels"])
    fused.set_fused_attention(mode["fused_attention"])
    fused.set_step_fusion(mode["step_fusion"])
    fused.set_direct_decode_linear(mode["direct_decode_linear"])
    fused.set_linear_rows(mode["linear_rows"])
    omni_kernels.set_pdl(mode["pdl"])
    omni_kernels.set_prefetch(mode["prefetch"])


_checked_in: dict = {}   # the decode tables as imported (before any mode changed them)
_tuned_tables: dict | None = None   # from --tables


def load_tables(path: str) -> dict:
    """The tuned decode tables of a `bench_kernels --tune-decode --result-json` file: {"decode": {(H, I): [(tokens,
    DecodeConfig)]}, "linear": {(N, K): LinearConfig | None}}."""
    from omni_kernels import moe_configs
    from omni_kernels.linear_decode import LinearConfig

    tuned = json.loads(Path(path).read_text())["decode_tuning"]
    shapes = {"thinker": moe_configs.THINKER, "talker": moe_configs.TALKER}
    decode = {shapes[name]: [(t, moe_configs.DecodeConfig(**c)) for t, c in entries]
              for name, entries in tuned["DECODE_CONFIGS"].items() if entries}
    linear = {tuple(int(v) for v in key.split("x")): c and LinearConfig(**c)
              for key, c in tuned["LINEAR_CONFIGS"].items()}
    return {"decode": decode, "linear": linear}


def use_tables(tuned: dict | None, decode_head: bool = True) -> None:
    """Set omni_kernels' decode tables (read at launch, so at graph capture) to the checked-in ones updated with
    `tuned` (`load_tables`); decode_head False drops the entries of linears too wide for the split-K finish (the
    lm_head: torch's linear then)."""
    from omni_kernels import linear_decode, moe_configs

    tables = ((moe_configs.DECODE_CONFIGS, "decode"), (linear_decode.LINEAR_CONFIGS, "linear"))
    for table, key in tables:
        _checked_in.setdefault(key, dict(table))
        table.clear()
        table.update(_checked_in[key])
        table.update((tuned or {}).get(key, {}))
    if not decode_head:
        for n, k in [shape for shape in linear_decode.LINEAR_CONFIGS if shape[0] > linear_decode.MAX_OUT]:
            del linear_decode.LINEAR_CONFIGS[(n, k)]


def selected_modes(args) -> list[str]:
    from omni_backends.engine import fused

    names = args.modes.split(",")
    unknown = set(names) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)} (known: {', '.join(MODES)})")
    if any(MODES[m].get("tables") == "tuned" for m in names) and _tuned_tables is None:
        raise SystemExit(f"modes {names} need --tables (a bench_kernels --tune-decode --result-json file)")
    return [m for m in MODES if m in names and (m == "off" or fused.available())]


def median_entry(times: list[float], floor_ms: float | None = None, rows: int = 1) -> dict:
    """ms per step over the rounds: the median, the best and every round's value, and (with a floor) the multiple
    of it."""
    ms = statistics.median(times)
    entry = {"ms_per_step": ms, "best_ms": min(times), "rounds_ms": times, "tokens_per_s": rows * 1e3 / ms}
    if floor_ms is not None:
        entry.update(floor_ms=floor_ms, x_floor=ms / floor_ms)
    return entry


def profile_steps(step, steps: int = 20) -> dict:
    """torch.profiler over `steps` calls of step(): per kernel name, launches and device us per step, and the
    step's device time not covered by any kernel (launch gaps, host waits)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
    kernels = []
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total > 0 and event.count >= steps:
            kernels.append({"kernel": event.key[:90], "per_step": event.count / steps, "us_per_step": total / steps})
    kernels.sort(key=lambda k: -k["us_per_step"])
    step_us = start.elapsed_time(end) * 1e3 / steps
    busy = sum(k["us_per_step"] for k in kernels)
    return {"step_us": step_us, "kernel_us": busy, "idle_us": step_us - busy,
            "launches_per_step": sum(k["per_step"] for k in kernels), "kernels": kernels}


def print_profile(label: str, prof: dict, top: int = 14) -> None:
    print(f"  profile {label}: {prof['step_us']:.0f} us per step, kernels {prof['kernel_us']:.0f} us "
          f"({prof['launches_per_step']:.0f} launches), between kernels {prof['idle_us']:.0f} us", flush=True)
    for k in prof["kernels"][:top]:
        print(f"    {k['us_per_step']:8.1f} us  {k['per_step']:6.1f}x  {k['kernel']}", flush=True)


def compare_logits(logits: torch.Tensor, reference: torch.Tensor) -> dict:
    """Per-step logits [steps, vocab] of the same token sequence under two kernel modes: the largest relative
    (||a - b|| / ||b|| per step) and absolute differences, the steps whose argmax differs, and whether every
    differing argmax is a near-tie (the reference's top-2 gap below twice the largest absolute difference)."""
    diff = (logits - reference).abs()
    top2 = reference.topk(2, dim=-1).values
    flips = (logits.argmax(-1) != reference.argmax(-1)).nonzero().flatten().tolist()
    max_abs = float(diff.max())
    return {"rel_max": float(((logits - reference).norm(dim=-1) / reference.norm(dim=-1)).max()), "abs_max": max_abs,
            "argmax_differs_at": flips,
            "flips_are_near_ties": all(float(top2[i, 0] - top2[i, 1]) < 2 * max_abs for i in flips)}


def step_inputs(args, batch: int, size: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The decode step input of `batch` rows: zeros, one row like the next (every row routed to the same experts), or
    with --distinct-rows a different random row each (token ids below `size` for int64, else [batch, size] embeddings
    of N(0, 0.02)), routed apart as served requests are."""
    if dtype == torch.long:
        if not args.distinct_rows:
            return torch.zeros(batch, dtype=dtype, device=device)
        return torch.randint(0, size, (batch,), generator=torch.Generator().manual_seed(batch)).to(device)
    if not args.distinct_rows:
        return torch.zeros(batch, size, dtype=dtype, device=device)
    return (torch.randn(batch, size, generator=torch.Generator().manual_seed(batch)) * 0.02).to(device, dtype)


def fill_slots(decoder, model_forward, prompt_embeds: torch.Tensor, count: int, cache_config) -> None:
    """Prefill one prompt with the library forward and place `count` copies of its KV in the decoder."""
    from transformers.cache_utils import DynamicCache

    from omni_backends.engine.kv_batch import cache_layers

    cache = DynamicCache(config=cache_config)
    model_forward(prompt_embeds, cache)
    for i in range(count):
        decoder.add(f"r{i}", cache_layers(cache))


def bench_thinker(path, config, device, args, bw: float) -> dict:
    from transformers.cache_utils import DynamicCache

    from omni_backends.engine import fused
    from omni_backends.engine.runner import cache_kwargs, text_mrope_position_ids
    from omni_backends.qwen3_omni.decoder import StaticDecoder
    from omni_backends.qwen3_omni.loading import load_thinker

    model = load_thinker(path, config, device)
    text_model = getattr(model.model, "language_model", model.model)
    text = config.thinker_config.text_config
    embed = model.get_input_embeddings()
    generator = torch.Generator(device=device).manual_seed(0)   # the same prompt in every run
    prompt = torch.randint(0, min(1000, text.vocab_size), (args.prompt_tokens,), device=device, generator=generator)

    def forward(ids, cache):
        positions = text_mrope_position_ids(torch.arange(ids.shape[-1], device=device)[None])
        return model(input_ids=ids[None], position_ids=positions, use_cache=True, **cache_kwargs(model, cache))

    def decode_32(decoder, forced: list[int] | None) -> tuple[list[int], torch.Tensor]:
        """32 greedy steps at batch 1 (or steps fed the `forced` tokens): (argmax ids, fp32 logits [32, vocab])."""
        fill_slots(decoder, forward, prompt, 1, text)
        ids, nxt, rows = [], int(forward(prompt, DynamicCache(config=text)).logits[0, -1].argmax()), []
        for i in range(32):
            feed = forced[i] if forced else nxt
            ids.append(feed)
            (logits,) = decoder.step(embed(torch.tensor([feed], device=device)), [args.prompt_tokens + i])
            rows.append(logits[0])
            nxt = int(logits[0].argmax())
        decoder.remove(["r0"])
        return ids, torch.stack(rows)

    reference_logits = None   # kernels off, teacher-forced on their own greedy tokens
    result = {"active_weight_bytes": active_bytes(text), "rounds": args.rounds, "modes": {}}
    runs = {}   # label -> (mode, graphs, decoder): every mode's decoder lives through all rounds
    for name in selected_modes(args):
        for graphs in ((True, False) if name in ("off", "on") and args.eager else (True,)):
            label = f"kernels_{name}" + ("" if graphs else "_eager")
            runs[label] = (name, graphs, StaticDecoder(
                text_model, head=lambda h: (fused.lm_head(model.lm_head, h).float(),), slots=max(args.batches),
                max_len=args.prompt_tokens + 2 * args.steps + 64, graphs=graphs, name=label))
            result["modes"][label] = {}
    times: dict[tuple[str, int], list[float]] = {}
    floors: dict[int, float] = {}
    for round_ in range(args.rounds):   # modes interleaved, so a slow spell of the machine hits all of them
        for label, (name, graphs, decoder) in runs.items():
            set_mode(name)   # a graph is captured with the switches of its first step
            for batch in (args.batches if graphs else [1]):
                fill_slots(decoder, forward, prompt, batch, text)
                step = [args.prompt_tokens]
                token = torch.zeros(batch, dtype=torch.long, device=device)

                def one():
                    decoder.step(embed(token), [step[0]] * batch)
                    step[0] += 1
                times.setdefault((label, batch), []).append(timed_ms(one, args.steps if graphs else 4, warmup=3))
                floors[batch] = (active_bytes(text) + batch * kv_bytes(text, step[0])) / bw * 1e3
                if args.profile and round_ == 0 and graphs and batch == 1 and device.startswith("cuda"):
                    result["modes"][label]["profile_batch_1"] = profile_steps(one)
                    print_profile(f"thinker {label} batch 1", result["modes"][label]["profile_batch_1"])
                decoder.remove([f"r{i}" for i in range(batch)])
        print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
            f"{label} {times[(label, 1)][-1]:.3f}" for label in runs) + " ms at batch 1", flush=True)
    for label, (name, graphs, decoder) in runs.items():
        set_mode(name)
        entry = result["modes"][label]
        for batch in (args.batches if graphs else [1]):
            entry[f"batch_{batch}"] = median_entry(times[(label, batch)], floors[batch], batch)
        if graphs:   # greedy tokens of the fixed prompt, batch 1; logits fed kernels-off's tokens vs theirs
            entry["greedy_tokens"], logits = decode_32(decoder, None)
            if name == "off":
                reference_logits, reference_tokens = logits, entry["greedy_tokens"]
            elif reference_logits is not None:
                entry["logits_vs_kernels_off"] = compare_logits(decode_32(decoder, reference_tokens)[1],
                                                                reference_logits)
            entry["graphs"] = decoder.graphs.stats().__dict__
        print(f"thinker {label}: " + ", ".join(f"{k} {v['ms_per_step']:.3f} ms ({v['x_floor']:.2f}x floor; best "
                                               f"round {v['best_ms']:.3f})"
                                               for k, v in entry.items() if k.startswith("batch")), flush=True)
    del runs, decoder
    torch.cuda.empty_cache() if device.startswith("cuda") else None
    if "kernels_off" in result["modes"]:
        off = result["modes"]["kernels_off"]["greedy_tokens"]
        for label, entry in result["modes"].items():
            if "greedy_tokens" in entry and label != "kernels_off":
                on = entry["greedy_tokens"]
                entry["greedy_equal_kernels_off"] = on == off
                entry["greedy_common_prefix_kernels_off"] = next((i for i, (a, b) in enumerate(zip(on, off))
                                                                  if a != b), len(on))
        if "kernels_on" in result["modes"]:
            result["greedy_equal_kernels_on_off"] = result["modes"]["kernels_on"]["greedy_equal_kernels_off"]
            result["greedy_common_prefix"] = result["modes"]["kernels_on"]["greedy_common_prefix_kernels_off"]
    for label, entry in result["modes"].items():
        if "logits_vs_kernels_off" in entry:
            c = entry["logits_vs_kernels_off"]
            print(f"thinker {label} vs kernels_off, 32 steps fed the same tokens: logits rel diff <= "
                  f"{c['rel_max']:.1e}, abs <= {c['abs_max']:.3f}; argmax differs at steps {c['argmax_differs_at']} "
                  f"(near-ties: {c['flips_are_near_ties']}); greedy common prefix "
                  f"{entry['greedy_common_prefix_kernels_off']} of 32", flush=True)
    set_mode("on")
    del model
    return result


def bench_talker(path, config, device, args) -> dict:
    from transformers.cache_utils import DynamicCache

    from omni_backends.engine.runner import cache_kwargs
    from omni_backends.qwen3_omni.loading import load_talker
    from omni_backends.qwen3_omni.talker import codec_suppress
    from omni_backends.qwen3_omni.talker_static import CodePredictorFrames, TalkerDecode

    talker = load_talker(path, config, device)
    tc = config.talker_config
    picks = {"suppress": codec_suppress(tc), "stop": (tc.codec_eos_token_id,)}   # code 0 picked in the frame graph
    hidden_size = tc.text_config.hidden_size
    prompt = torch.randn(40, hidden_size, device=device, dtype=talker.dtype) * 0.02

    def forward(embeds, cache):
        n = embeds.shape[0]
        positions = torch.arange(n, device=device).view(1, 1, n).expand(3, 1, n)
        return talker(inputs_embeds=embeds[None], position_ids=positions, use_cache=True, output_hidden_states=True,
                      generation_step=0, **cache_kwargs(talker, cache))

    result = {"rounds": args.rounds, "modes": {}}
    runs, codes = {}, {}
    for name in selected_modes(args):
        set_mode(name)
        runs[name] = (TalkerDecode(talker, slots=max(args.batches), max_len=40 + args.steps + 16),
                      CodePredictorFrames(talker, max_batch=max(args.batches), **picks))
    times: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for round_ in range(args.rounds):
        for name, (decode, frames) in runs.items():
            set_mode(name)
            for batch in args.batches:
                fill_slots(decode.decoder, forward, prompt, batch, tc.text_config)
                position = [40]
                embeds = step_inputs(args, batch, hidden_size, talker.dtype, device)
                logits = torch.zeros(batch, tc.text_config.vocab_size, device=device)
                rows = ([-1] * batch, [False] * batch, [True] * batch, [None] * batch)   # greedy, code 0 on the device

                def one():
                    hidden, step_logits = decode.decoder.step(embeds, [position[0]] * batch)
                    frames(hidden, step_logits, *rows)
                    position[0] += 1
                ms = timed_ms(one, min(args.steps, 8 + 16), warmup=3)
                predictor = timed_ms(lambda: frames(embeds, logits, *rows), 16)
                times.setdefault((name, batch), []).append((ms, predictor))
                if args.profile and round_ == 0 and batch in args.profile_batches and device.startswith("cuda"):
                    result["modes"].setdefault(f"static_kernels_{name}", {})[f"profile_batch_{batch}"] = prof = \
                        profile_steps(one, steps=8)
                    print_profile(f"talker {name} batch {batch}", prof, top=args.profile_top)
                decode.decoder.remove([f"r{i}" for i in range(batch)])
                if round_ == 0:   # from the prefill's state, the same in every mode
                    fill_slots(decode.decoder, forward, prompt, batch, tc.text_config)
                    codes[(name, batch)] = greedy_frames(decode, frames, embeds, 40, rows)
                    decode.decoder.remove([f"r{i}" for i in range(batch)])
    for name, (decode, frames) in runs.items():
        entry = result["modes"].setdefault(f"static_kernels_{name}", {})
        for batch in args.batches:
            frame_ms = [t[0] for t in times[(name, batch)]]
            predictor_ms = [t[1] for t in times[(name, batch)]]
            entry[f"batch_{batch}"] = {"frame_ms": statistics.median(frame_ms), "rounds_frame_ms": frame_ms,
                                       "code_predictor_ms": statistics.median(predictor_ms),
                                       "frames_per_s": batch * 1e3 / statistics.median(frame_ms),
                                       "greedy_codes": codes[(name, batch)]}
            first = codes[(next(iter(runs)), batch)]
            entry[f"batch_{batch}"]["codes_equal_first_mode"] = codes_agreement(codes[(name, batch)], first)
        entry["graphs"] = {"talker": decode.decoder.graphs.stats().__dict__, "predictor": frames.graphs.stats().__dict__}
        print(f"talker static kernels {name}: " + ", ".join(
            f"{k} {v['frame_ms']:.2f} ms/frame (predictor {v['code_predictor_ms']:.2f})"
            for k, v in entry.items() if k.startswith("batch")), flush=True)
    del runs
    set_mode("on")
    # "before": transformers' forward with a DynamicCache, as the dynamic engine runs a frame.
    predictor = talker.code_predictor
    entry = {}
    for batch in (1,):
        cache = DynamicCache(config=tc.text_config)
        forward(prompt, cache)

        def one():
            out = talker(inputs_embeds=prompt[:1][None], use_cache=True, output_hidden_states=True, generation_step=0,
                         position_ids=torch.full((3, 1, 1), cache.get_seq_length(), device=device),
                         **cache_kwargs(talker, cache))
            hidden = out.hidden_states[0][-1][:, -1]
            embeds = torch.stack([hidden, talker.get_input_embeddings()(torch.zeros(1, dtype=torch.long,
                                                                                     device=device))], 1)
            inner = DynamicCache(config=predictor.config)
            for group in range(1, tc.num_code_groups):
                h = predictor.model(inputs_embeds=embeds, use_cache=True,
                                    **cache_kwargs(predictor.model, inner)).last_hidden_state[:, -1]
                code = predictor.lm_head[group - 1](h).argmax(-1)
                embeds = predictor.get_input_embeddings()[group - 1](code)[:, None]
            int(code[0])
        entry[f"batch_{batch}"] = {"frame_ms": timed_ms(one, 6, warmup=2)}
    result["modes"]["dynamic"] = entry
    print(f"talker dynamic (transformers forward): batch_1 {entry['batch_1']['frame_ms']:.2f} ms/frame", flush=True)
    del talker
    return result


def greedy_frames(decode, frames, embeds: torch.Tensor, position: int, rows: tuple, count: int = 4) -> list:
    """`count` greedy frames of the slots now in `decode` (talker step, then the frame graph; each frame's codec sum
    + `embeds` is the next step's input, as served): codes as nested lists [count][batch][16]."""
    out = []
    for i in range(count):
        hidden, logits = decode.decoder.step(embeds, [position + i] * embeds.shape[0])
        step_codes, next_embeds = frames(hidden, logits, *rows)
        out.append(step_codes.tolist())
        embeds = next_embeds + embeds
    return out


def codes_agreement(codes: list, reference: list) -> dict:
    """How far two modes' `greedy_frames` agree: equal codes / all, and the first frame that differs (None: all
    equal). A differing code changes every later frame's input, so later frames differ wholesale after one flip."""
    import numpy as np

    a, b = np.array(codes), np.array(reference)
    differs = [i for i in range(len(a)) if not np.array_equal(a[i], b[i])]
    return {"equal": int((a == b).sum()), "of": int(a.size), "first_differing_frame": differs[0] if differs else None}


def bench_overlap(path, config, device, args) -> dict:
    """Thinker decode steps and talker frames at the same time, each engine on its own thread and CUDA stream
    (the co-located layout), against each alone and against both on one stream (what two stage processes
    time-slicing the GPU approach). Per SM split (`args.sm_splits`) and batch size: ms per thinker step and per
    talker frame alone, and ms per (step + frame) pair run serially vs concurrently; keys `batch_N` (split off)
    or `batch_N sm_split S`; a split the driver refuses is reported as `sm_split S: error`."""
    from omni_backends.engine import fused, sm_split
    from omni_backends.engine.runner import cache_kwargs, text_mrope_position_ids
    from omni_backends.qwen3_omni.decoder import StaticDecoder
    from omni_backends.qwen3_omni.loading import load_talker, load_thinker
    from omni_backends.qwen3_omni.talker import codec_suppress
    from omni_backends.qwen3_omni.talker_static import CodePredictorFrames, TalkerDecode

    thinker = load_thinker(path, config, device)
    talker = load_talker(path, config, device)
    text = config.thinker_config.text_config
    tc = config.talker_config
    text_model = getattr(thinker.model, "language_model", thinker.model)
    embed = thinker.get_input_embeddings()
    prompt = torch.randint(0, 1000, (args.prompt_tokens,), device=device)
    talker_prompt = torch.randn(40, tc.text_config.hidden_size, device=device, dtype=talker.dtype) * 0.02

    def thinker_forward(ids, cache):
        positions = text_mrope_position_ids(torch.arange(ids.shape[-1], device=device)[None])
        return thinker(input_ids=ids[None], position_ids=positions, use_cache=True, **cache_kwargs(thinker, cache))

    def talker_forward(embeds, cache):
        n = embeds.shape[0]
        positions = torch.arange(n, device=device).view(1, 1, n).expand(3, 1, n)
        return talker(inputs_embeds=embeds[None], position_ids=positions, use_cache=True, output_hidden_states=True,
                      generation_step=0, **cache_kwargs(talker, cache))

    result = {}
    for split in args.sm_splits:
        try:
            parts = sm_split.from_setting(split, device)
        except (RuntimeError, ValueError) as exc:
            print(f"overlap sm_split {split}: {exc}", flush=True)
            result[f"sm_split {split}: error"] = str(exc)
            continue
        if parts:
            print(f"overlap sm_split {split}: SMs " + ", ".join(f"{n} {p.sms}" for n, p in parts.items()), flush=True)
            result[f"sm_split {split}: sms"] = {n: p.sms for n, p in parts.items()}
        steps = args.steps
        decoder = StaticDecoder(text_model, head=lambda h: (fused.lm_head(thinker.lm_head, h).float(),),
                                slots=max(args.batches), max_len=args.prompt_tokens + 4 * steps + 64,
                                name="overlap-thinker")
        decode = TalkerDecode(talker, slots=max(args.batches), max_len=40 + 4 * steps + 16)
        frames = CodePredictorFrames(talker, max_batch=max(args.batches), suppress=codec_suppress(tc),
                                     stop=(tc.codec_eos_token_id,))
        engines = {"decoder": decoder, "decode": decode, "frames": frames, "embed": embed, "text": text, "tc": tc,
                   "thinker_forward": thinker_forward, "talker_forward": talker_forward, "prompt": prompt,
                   "talker_prompt": talker_prompt}
        result.update(overlap_batches(args, engines, parts, "" if not parts else f" sm_split {split}"))
        del decoder, decode, frames, engines
        torch.cuda.empty_cache()
    del thinker, talker
    torch.cuda.empty_cache()
    return result


def overlap_batches(args, engines: dict, parts: dict, label: str) -> dict:
    """`bench_overlap`'s timings of one SM split (`parts`: `sm_split.Partition` by engine; the thinker's and the
    talker's streams, graph captures and loops run within theirs): per batch size, the thinker step and the talker
    frame alone, the pair on one stream and on two threads / streams."""
    import threading

    from omni_backends.engine import sm_split

    decoder, decode, frames, embed = engines["decoder"], engines["decode"], engines["frames"], engines["embed"]
    text, tc, prompt, device = engines["text"], engines["tc"], engines["prompt"], engines["prompt"].device
    talker_dtype, steps = engines["talker_prompt"].dtype, args.steps
    part_of = {"thinker": parts.get("thinker"), "talker": parts.get("talker")}
    streams = [part_of["thinker"].stream() if part_of["thinker"] else torch.cuda.Stream(device),
               part_of["talker"].stream(-1) if part_of["talker"] else torch.cuda.Stream(device, priority=-1)]
    result = {}
    for batch in args.batches:
        fill_slots(decoder, engines["thinker_forward"], prompt, batch, text)
        fill_slots(decode.decoder, engines["talker_forward"], engines["talker_prompt"], batch, tc.text_config)
        position = {"thinker": args.prompt_tokens, "talker": 40}
        tokens = step_inputs(args, batch, text.vocab_size, torch.long, device)
        embeds = step_inputs(args, batch, tc.text_config.hidden_size, talker_dtype, device)

        def thinker_step():
            (logits,) = decoder.step(embed(tokens), [position["thinker"]] * batch)
            logits.argmax(-1).tolist()   # the engine's one host synchronisation per step
            position["thinker"] += 1

        def talker_frame():
            hidden, logits = decode.decoder.step(embeds, [position["talker"]] * batch)
            codes, _ = frames(hidden, logits, [-1] * batch, [False] * batch, [True] * batch, [None] * batch)
            codes.cpu()
            position["talker"] += 1

        def loop(fn, stream, n, part=None):
            with torch.cuda.stream(stream), torch.inference_mode(), sm_split.within(part):
                for _ in range(n):
                    fn()

        def wall_ms(work) -> float:
            torch.cuda.synchronize()
            start = time.perf_counter()
            work()
            torch.cuda.synchronize()
            return (time.perf_counter() - start) * 1e3

        loop(thinker_step, streams[0], 3, part_of["thinker"])   # the graphs are captured within the partitions
        loop(talker_frame, streams[1], 3, part_of["talker"])
        alone = {"thinker_step_ms": wall_ms(lambda: loop(thinker_step, streams[0], steps)) / steps,
                 "talker_frame_ms": wall_ms(lambda: loop(talker_frame, streams[1], steps)) / steps}
        serial = wall_ms(lambda: loop(lambda: (thinker_step(), talker_frame()), streams[0], steps)) / steps

        def concurrent():
            threads = [threading.Thread(target=loop, args=(fn, stream, steps))
                       for fn, stream in ((thinker_step, streams[0]), (talker_frame, streams[1]))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        both = wall_ms(concurrent) / steps
        result[f"batch_{batch}{label}"] = {**alone, "serial_pair_ms": serial, "concurrent_pair_ms": both,
                                    "overlap_gain": serial / both}
        decoder.remove([f"r{i}" for i in range(batch)])
        decode.decoder.remove([f"r{i}" for i in range(batch)])
        print(f"overlap batch_{batch}{label}: thinker step {alone['thinker_step_ms']:.2f} ms, talker frame "
              f"{alone['talker_frame_ms']:.2f} ms alone; step + frame serial {serial:.2f} ms, concurrent "
              f"(two threads, two streams) {both:.2f} ms ({serial / both:.2f}x)", flush=True)
    return result


def thread_cpu_s(thread) -> float:
    """CPU seconds (user + system) a thread has used so far, from /proc (Linux; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_pipeline(path, config, device, args) -> dict:
    import threading

    from omni_backends.engine.options import EngineOptions
    from omni_backends.qwen3_omni.loading import load_stages
    from omni_backends.qwen3_omni.pipeline import LocalOmniPipeline, OmniRequest

    stages = load_stages(path, device)
    tts_ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
    with torch.inference_mode():
        tts_embeds = stages.thinker.get_input_embeddings()(torch.tensor(tts_ids, device=device))
    pipe = LocalOmniPipeline.from_stages(stages, tts_embeds, chunk_frames=25, first_chunk_frames=3,
                                         left_context_frames=25,
                                         options=EngineOptions(engine="static", max_len=1024), max_running=32)
    pipe.thinker.warmup()
    pipe.talker.warmup()
    pipe.code2wav.warmup()
    tokens, frames = args.pipeline_tokens, args.pipeline_frames

    def requests(n: int, tag: str) -> list:
        return [OmniRequest(f"{tag}{i}", [{"role": "user", "content": f"Tell me story number {i}, please."}],
                            pipe.thinker.sampling_params(max_tokens=tokens, min_tokens=tokens, do_sample=False),
                            pipe.talker.sampling_params(do_sample=False, repetition_penalty=1.0, max_frames=frames,
                                                        min_frames=frames))
                for i in range(n)]

    result = {}
    pipe.run(requests(2, "warm"))
    runs = [(n, ms / 1e3) for ms in args.pipeline_switch_ms for n in args.pipeline_concurrency]
    for n, switch in runs:
        sys.setswitchinterval(switch)
        threads = {t.name: t for t in threading.enumerate()}
        before = {name: thread_cpu_s(t) for name, t in threads.items()}
        start = time.perf_counter()
        out = pipe.run(requests(n, f"c{n}-{switch}-"))
        wall = time.perf_counter() - start
        audio_s = min(r.audio.shape[0] for r in out.values()) / 24000
        cpu = {name: thread_cpu_s(t) - before[name] for name, t in threads.items() if t.is_alive()}
        label = f"concurrency_{n}_switch_{switch * 1e3:g}ms"
        result[label] = {"wall_s": wall, "audio_s": audio_s, "rtf": wall / audio_s, "ms_per_frame": wall * 1e3 / frames,
                         "thread_cpu_s": {k: v for k, v in cpu.items() if v > 0.01}}
        busy = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v > 0.05)
        print(f"pipeline {label}: {wall:.3f} s for {audio_s:.2f} s of audio per request (RTF {wall / audio_s:.3f}, "
              f"{wall * 1e3 / frames:.2f} ms per frame); thread CPU: {busy}", flush=True)
    sys.setswitchinterval(0.005)
    pipe.close()
    del pipe, stages
    torch.cuda.empty_cache() if device.startswith("cuda") else None
    return result


def checkpoint_path(name: str) -> Path | None:
    """A checkpoint directory from a path or a preset name (prepared into the model home first, e.g. the full-size
    random `qwen3_omni_30b_a3b_random`); None when preparing the preset failed."""
    from omni_backends import prepare
    from omni_backends.paths import model_home

    path = Path(name)
    if path.is_absolute():
        return path
    if name in prepare.PREPARERS and prepare.main([name]) != 0:
        return None
    return model_home() / path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="qwen3_omni_30b_a3b_random", help="preset name or directory")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--steps", type=int, default=64, help="timed decode steps per batch size")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--parts", default="thinker,talker,overlap", help="of thinker,talker,overlap,pipeline")
    parser.add_argument("--pipeline-concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--pipeline-tokens", type=int, default=128)
    parser.add_argument("--pipeline-frames", type=int, default=125)
    parser.add_argument("--pipeline-switch-ms", type=float, nargs="+", default=[5.0, 0.5],
                        help="Python thread switch intervals to run the pipeline with (sys.setswitchinterval)")
    parser.add_argument("--modes", default="off,on,on_unfused_step,on_unfused_attention",
                        help=f"thinker/talker kernel modes, of {','.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every mode this many times, modes interleaved; report medians")
    parser.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the thinker without CUDA graphs (modes off and on)")
    parser.add_argument("--profile", action="store_true", help="kernel breakdown of each graph mode at batch 1")
    parser.add_argument("--profile-batches", type=int, nargs="+", default=[1],
                        help="talker part: the batch sizes --profile breaks down (default 1)")
    parser.add_argument("--profile-top", type=int, default=14, help="kernels listed per profile")
    parser.add_argument("--distinct-rows", action="store_true",
                        help="talker and overlap parts: each row its own random input (routed to its own experts, as "
                             "served requests are) instead of identical rows")
    parser.add_argument("--tables", help="a bench_kernels --tune-decode --result-json file: the decode tiles of the "
                                         "on_tuned modes (the other modes keep the checked-in tables)")
    parser.add_argument("--sm-splits", nargs="+", default=["off"],
                        help="overlap part: engine.sm_split settings to time (e.g. off thinker:96,talker:36)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    global _tuned_tables
    _tuned_tables = load_tables(args.tables) if args.tables else None
    from omni_backends.qwen3_omni.loading import load_config

    path = checkpoint_path(args.checkpoint)
    if path is None:
        return 1
    config = load_config(path)
    bw = bandwidth(args.device)
    results = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
               "torch": torch.__version__, "checkpoint": str(path), "bandwidth_bytes_per_s": bw}
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s", flush=True)
    with torch.inference_mode():
        if "thinker" in args.parts:
            results["thinker"] = bench_thinker(path, config, args.device, args, bw)
        if "talker" in args.parts:
            results["talker"] = bench_talker(path, config, args.device, args)
        if "overlap" in args.parts and args.device.startswith("cuda"):
            results["overlap"] = bench_overlap(path, config, args.device, args)
    if "pipeline" in args.parts:   # outside inference mode, as served (the engine threads update its caches)
        results["pipeline"] = bench_pipeline(path, config, args.device, args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
