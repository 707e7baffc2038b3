"""`scripts/bench`: benchmark a running Omni-Triton frontend (see docs/benchmarks.md).

Example: scripts/bench --workload chat-audio --model voice --num-prompts 16 --max-concurrency 1 4 8 \
             --result-json var/bench/voice.json --baseline inprocess
         scripts/bench --workload realtime --num-prompts 8 --result-json var/bench/realtime.json
GPU (docs/gpu.md): the baseline alone first (`--baseline-only`, the model fills the GPU), then the served
sweep over Triton gRPC comparing with it (`--transport triton --baseline var/bench/baseline.json`).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import httpx

from omni_bench import peer, report
from omni_bench.baseline import INPROCESS, KINDS, check_supported, run_baseline  # model code only inside run_baseline
from omni_bench.client import ENDPOINTS, WORKLOADS, RequestOptions, StreamError, read_wav, send, synthesize_inputs
from omni_bench.datasets import BUILTIN, load_prompts
from omni_bench.metrics import request_metrics, summarize
from omni_bench.runner import http_client, run_level
from omni_bench.triton_transport import TRANSPORTS, send_triton

DEFAULT_MODELS = {"chat": "voice", "chat-audio": "voice", "speech": "tts", "transcription": "asr",
                  "images": "qwen_image", "videos": "wan", "realtime": "voice"}
REALTIME = "realtime"  # /v1/realtime sessions (omni_bench.realtime), not an HTTP request workload


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workload", choices=WORKLOADS + (REALTIME,), default="chat")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the frontend")
    p.add_argument("--transport", choices=TRANSPORTS, default="http",
                   help="http: OpenAI API of the frontend; triton: gRPC streaming to the client-facing Triton "
                        "model named by --model (chat workloads; no frontend needed)")
    p.add_argument("--triton-url", default="127.0.0.1:8001", help="Triton gRPC host:port (--transport triton)")
    p.add_argument("--model", help="OpenAI model id (default: voice for chat workloads, tts, asr)")
    p.add_argument("--endpoint", help="route (default: the workload's OpenAI route)")
    p.add_argument("--num-prompts", type=int, default=16, help="timed requests per concurrency level")
    p.add_argument("--max-concurrency", type=int, nargs="+", default=[1],
                   help="requests in flight at most; several values run a sweep; 0 = no cap")
    p.add_argument("--request-rate", type=float, default=math.inf, help="Poisson arrivals per second")
    p.add_argument("--num-warmups", type=int, default=1, help="untimed requests before each level")
    p.add_argument("--dataset", default=BUILTIN, help="'builtin' or a JSONL file of {\"prompt\": ...} lines")
    p.add_argument("--seed", type=int, default=0, help="prompt shuffle and Poisson schedule")
    p.add_argument("--max-tokens", type=int, default=64, help="chat max_tokens")
    p.add_argument("--size", default="64x64", help="images, videos: WIDTHxHEIGHT")
    p.add_argument("--steps", type=int, default=4, help="images, videos: num_inference_steps")
    p.add_argument("--frames", type=int, default=17, help="videos: num_frames (4k+1; 17 = 1 s at 16 fps)")
    p.add_argument("--voice", help="output voice (chat-audio: sends audio.format pcm16; default: the server's "
                                   "default voice, streamed as WAV; speech default: alloy)")
    p.add_argument("--extra-body", type=json.loads, default={},
                   help="JSON object merged last into each request body (form fields for transcription)")
    p.add_argument("--audio-file", help="transcription input (any soundfile-readable file); default: each "
                                        "prompt spoken by the server's /v1/audio/speech")
    p.add_argument("--speech-model", help="speech model that synthesizes transcription input")
    p.add_argument("--api-key", default=os.environ.get("OMNI_API_KEY"), help="bearer token ($OMNI_API_KEY)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--result-json", help="write config, per-request records and summaries here")
    p.add_argument("--plot", help="write a PNG of medians and throughput against concurrency (needs matplotlib)")
    p.add_argument("--baseline", metavar="inprocess|inprocess-chunked|JSON",
                   help="inprocess: also run the prompts through the model library in this process and compare (voice: "
                        "the sequential chain, speech per whole sentence); inprocess-chunked (voice): the same chain "
                        "with the served pipeline's chunking; a JSON file written by --baseline-only: compare with "
                        "that baseline")
    p.add_argument("--baseline-only", action="store_true",
                   help="run only the in-process baseline (no server needed; --baseline inprocess unless it names "
                        "the other in-process kind) and write it to --result-json")
    p.add_argument("--baseline-prompts", type=int, help="prompts for the in-process baseline (default: all)")
    p.add_argument("--checkpoint", help="baseline checkpoint directory or preset (qwen3_omni / qwen_image / wan; "
                                        "default $OMNI_MODEL_HOME/qwen3_omni_tiny / qwen_image_tiny / wan_tiny)")
    p.add_argument("--device", default="cpu", help="baseline device (cpu, cuda, cuda:N)")
    p.add_argument("--tts-engine", choices=("kokoro", "piper"), default="kokoro",
                   help="voice baseline: the speech engine of the in-process chain (give the server's --tts-engine)")
    p.add_argument("--baseline-url", help="a peer OpenAI-compatible server (e.g. scripts/peer_asr_server): every level "
                                          "also runs there, alternated with the served runs, with CPU-s per audio-s and "
                                          "/health latency of both servers")
    p.add_argument("--baseline-model", help="model id sent to --baseline-url (default: --model)")
    p.add_argument("--rounds", type=int, default=2, help="with --baseline-url: served/peer runs per level (each all prompts)")
    realtime = p.add_argument_group("realtime workload (omni_bench.realtime)")
    realtime.add_argument("--turn-detection", choices=["server_vad", "manual"], default="server_vad",
                          help="server VAD ends each turn, or the client commits right after the speech")
    realtime.add_argument("--silence-s", type=float, default=1.0, help="silence appended after each spoken prompt")
    realtime.add_argument("--barge-ins", type=int, default=4, help="barge-in measurements (one session each)")
    realtime.add_argument("--vad-sessions", type=int, default=4, help="live sessions for the VAD CPU measurement (0: skip)")
    realtime.add_argument("--vad-seconds", type=float, default=20.0, help="length of the VAD CPU measurement")
    realtime.add_argument("--commit-baseline", action="store_true",
                          help="also run each turn with the response created at the commit (no preemptive response): "
                               "a same-run baseline for the server's --realtime-speculation-ms")
    args = p.parse_args(argv)
    if not isinstance(args.extra_body, dict):
        p.error("--extra-body must be a JSON object")
    if args.num_prompts < 1 or args.num_warmups < 0 or args.request_rate <= 0 or min(args.max_concurrency) < 0:
        p.error("--num-prompts must be >= 1, --num-warmups and --max-concurrency >= 0, --request-rate > 0")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    args.model = args.model or DEFAULT_MODELS[args.workload]
    if args.baseline and args.workload == REALTIME:
        p.error("--baseline does not apply to the realtime workload")
    if args.baseline_prompts is not None and args.baseline_prompts < 1:
        p.error(f"--baseline-prompts must be >= 1, got {args.baseline_prompts}")
    if args.baseline_only and args.baseline_url:
        p.error("--baseline-only runs no served levels; --baseline-url compares served levels with a peer")
    if args.baseline_only and args.baseline is not None and args.baseline not in KINDS:
        p.error(f"--baseline-only runs an in-process baseline: --baseline must be "
                f"{' or '.join(map(repr, KINDS))}, got {args.baseline!r}")
    if args.baseline_only and args.baseline is None:
        args.baseline = INPROCESS
    if args.transport == "triton" and args.workload not in ("chat", "chat-audio"):
        p.error("--transport triton supports the chat and chat-audio workloads")
    if args.baseline in KINDS:
        try:
            check_supported(args.model, args.workload, args.baseline)
        except ValueError as exc:
            p.error(str(exc))
    elif args.baseline is not None and not Path(args.baseline).is_file():
        p.error(f"--baseline must be {' or '.join(map(repr, KINDS))} or an existing JSON file, got {args.baseline!r}")
    args.endpoint = args.endpoint or ENDPOINTS.get(args.workload, "/v1/realtime")
    return args


async def _levels(args: argparse.Namespace, prompts: list[str], audio_file: bytes | None) -> tuple[list[dict], list[dict]]:
    """Served levels, and with --baseline-url the peer's levels (alternated with the served runs)."""
    async with contextlib.AsyncExitStack() as stack:
        cap_max = max(args.max_concurrency)
        client = await stack.enter_async_context(http_client(args.base_url, args.api_key, args.timeout, cap_max))
        audio: tuple[bytes, ...] = ()
        if args.workload == "transcription":
            audio = (audio_file,) if audio_file else \
                await synthesize_inputs(client, prompts, args.speech_model, args.voice)
        options = RequestOptions(args.workload, args.model, args.endpoint, args.voice, args.max_tokens,
                                 args.extra_body, audio, args.size, args.steps, args.frames)
        if args.transport == "triton":
            def one(index, prompt, start):
                return send_triton(args.triton_url, options, index, prompt, start, args.timeout)
        else:
            def one(index, prompt, start):
                return send(client, options, index, prompt, start)
        sides = [(one, client, peer.listening_process(args.base_url))]
        if args.baseline_url:
            peer_client = await stack.enter_async_context(http_client(args.baseline_url, None, args.timeout, cap_max))
            peer_options = dataclasses.replace(options, model=args.baseline_model or args.model)

            def peer_one(index, prompt, start):
                return send(peer_client, peer_options, index, prompt, start)
            sides.append((peer_one, peer_client, peer.listening_process(args.baseline_url)))
        levels, peer_levels = [], []
        for cap in args.max_concurrency:
            level = {"max_concurrency": cap or None, "request_rate": args.request_rate,
                     "num_warmups": args.num_warmups, "seed": args.seed}
            if not args.baseline_url:
                records, duration = await run_level(one, prompts, **level)
                levels.append(level_result(args.workload, args.model, cap or None, args.request_rate, records, duration))
                print(report.table(levels[-1]), flush=True)
                continue
            for (records, duration, cpu, health), out, name in zip(
                    await peer.alternated(sides, prompts, args.rounds, **level), (levels, peer_levels),
                    (args.model, f"{args.baseline_url} (peer)")):
                out.append(level_result(args.workload, name, cap or None, args.request_rate, records, duration))
                out[-1]["server_usage"] = peer.usage(records, cpu, health, args.workload)
                print(report.table(out[-1]), flush=True)
        return levels, peer_levels


def level_result(workload: str, model: str, cap: int | None, rate: float, records, duration: float) -> dict:
    """The JSON entry of one level: its settings, `summarize` of its records and every record with its metrics."""
    return {"workload": workload, "model": model, "max_concurrency": cap,
            "request_rate": rate if math.isfinite(rate) else "inf", "summary": summarize(records, duration),
            "requests": [{**r.to_json(), "metrics": request_metrics(r)} for r in records]}


def _baseline(args: argparse.Namespace, prompts: list[str], levels: list[dict]) -> dict:
    """The baseline level (run in-process now, or read from a --baseline-only JSON) compared with the served
    max_concurrency=1 level."""
    if args.baseline in KINDS:
        records, duration = run_baseline(args.model, args.workload, prompts[:args.baseline_prompts or None],
                                         max_tokens=args.max_tokens, voice=args.voice, checkpoint=args.checkpoint,
                                         num_warmups=args.num_warmups, extra_body=args.extra_body,
                                         device=args.device, size=args.size, steps=args.steps,
                                         frames=args.frames, tts_engine=args.tts_engine, kind=args.baseline)
        result = {**level_result(args.workload, args.model, 1, math.inf, records, duration), "kind": args.baseline}
        print(report.table({**result, "model": f"{args.model} ({args.baseline} baseline)"}))
    else:
        result = json.loads(Path(args.baseline).read_text())["baseline"]
        result["source"] = args.baseline
    if levels:
        served = next((level for level in levels if level["max_concurrency"] == 1), levels[0])
        result["compared_with_max_concurrency"] = served["max_concurrency"]
        result["comparison"] = report.compare(served["summary"], result["summary"])
        print(report.comparison_table(result["comparison"], served["max_concurrency"]))
    return result


def _realtime(args: argparse.Namespace, prompts: list[str], started: float) -> int:
    from omni_bench import realtime

    async def run():
        async with http_client(args.base_url, args.api_key, args.timeout, 1) as client:
            return await realtime.run(args, prompts, client)

    try:
        result = asyncio.run(run())
    except (StreamError, httpx.HTTPError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    print(realtime.table(result))
    if args.result_json:
        Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
        config = {k: v for k, v in vars(args).items() if k != "api_key"}
        Path(args.result_json).write_text(json.dumps({"config": {**config, "request_rate": "inf", "started_at": started},
                                                      **result}, indent=1))
        print(f"results written to {args.result_json}")
    return 1 if result["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when any timed request failed (the JSON is written anyway)."""
    args = parse_args(argv)
    try:
        prompts = load_prompts(args.dataset, args.num_prompts, args.seed)
        audio_file = read_wav(args.audio_file) if args.audio_file else None
    except (OSError, ValueError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    started = time.time()
    if args.workload == REALTIME:
        return _realtime(args, prompts, started)
    try:
        levels, peer_levels = ([], []) if args.baseline_only else asyncio.run(_levels(args, prompts, audio_file))
    except (StreamError, httpx.HTTPError) as exc:  # preparing transcription input failed
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    result = {"config": {**{k: v for k, v in vars(args).items() if k != "api_key"},
                         "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
                         "started_at": started},
              "levels": levels}
    if args.baseline:
        result["baseline"] = _baseline(args, prompts, levels)
    if peer_levels:
        compared = [(p["max_concurrency"], peer.comparison(s, p)) for s, p in zip(levels, peer_levels)]
        result["baseline_server"] = {"url": args.baseline_url, "rounds": args.rounds, "levels": peer_levels,
                                     "comparison": [{"max_concurrency": cap, **c} for cap, c in compared]}
        print(peer.comparison_table(compared, args.baseline_url))
    if args.result_json:
        Path(args.result_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.result_json).write_text(json.dumps(result, indent=1))
        print(f"results written to {args.result_json}")
    if args.plot:
        print(report.plot(levels, args.plot))
    errors = [r["error"] for level in levels + peer_levels for r in level["requests"] if r["error"]]
    if errors:
        print(f"bench: {len(errors)} request(s) failed; the first: {errors[0]}", file=sys.stderr)
    return 1 if errors else 0
