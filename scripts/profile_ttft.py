#!/usr/bin/env python
"""Where the text path's time to first token goes: the same greedy request measured at each layer.

  engine       ChatLLM in this process (SmolLM2 on the served thread count, prefix cache warm): no serving
  voice_llm    the LLM stage over Triton gRPC streaming (tritonclient): + Triton + one Python-backend stub
  voice        the voice orchestrator over Triton gRPC: + one BLS hop (voice -> voice_llm) and its events
  http         POST /v1/chat/completions (stream, modalities ["text"]): + the frontend (FastAPI, SSE, gRPC client)

The layers are measured round-robin (one request each, repeated), so machine load hits them alike;
medians and the difference each layer adds are printed, and written as JSON with --result-json.
Usage: .venv/bin/python scripts/profile_ttft.py --base-url http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 [-n 20]
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import time

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

PROMPT = "What is the capital of France?"
LAYERS = ("engine", "voice_llm", "voice", "http")


def _grpc_ttft(client: grpcclient.InferenceServerClient, model: str, body: dict) -> float:
    """Seconds from sending to the first response carrying a non-empty text delta."""
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((time.perf_counter(), result, error)))
    try:
        request = grpcclient.InferInput("REQUEST", [1], "BYTES")
        request.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=np.object_))
        sent = time.perf_counter()
        client.async_stream_infer(model, [request], enable_empty_final_response=True)
        first = None
        while True:
            t, result, error = arrived.get(timeout=120)
            if error is not None:
                raise RuntimeError(f"{model}: {error}")
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            event = json.loads(result.as_numpy("EVENT").reshape(-1)[0])
            if first is None and event.get("type") == "text.delta" and event.get("text"):
                first = t - sent
        return first
    finally:
        client.stop_stream()


def _http_ttft(client: httpx.Client, max_tokens: int) -> float:
    body = {"model": "voice", "messages": [{"role": "user", "content": PROMPT}], "modalities": ["text"],
            "temperature": 0.0, "max_tokens": max_tokens, "stream": True}
    first = None
    sent = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    first = time.perf_counter() - sent
    return first


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--grpc-url", default="127.0.0.1:8001")
    p.add_argument("-n", type=int, default=20, help="requests per layer")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--llm-threads", type=int, default=1, help="threads of the in-process engine (voice_llm's)")
    p.add_argument("--result-json")
    args = p.parse_args()

    from omni_backends.engine import SamplingParams
    from omni_backends.voice.llm import ChatLLM

    llm = ChatLLM(threads=args.llm_threads)
    messages = [{"role": "user", "content": PROMPT}]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def engine() -> float:
        sent = time.perf_counter()
        deltas = llm.generate(messages, params)
        next(d for d in deltas if d.text)
        ttft = time.perf_counter() - sent
        for _ in deltas:  # let the request finish, as the served layers do
            pass
        return ttft

    body = {"messages": messages, "temperature": 0.0, "max_tokens": args.max_tokens}
    voice_body = {**body, "messages": [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}],
                  "modalities": ["text"], "voice": None, "stop": []}
    triton = grpcclient.InferenceServerClient(args.grpc_url)
    http = httpx.Client(base_url=args.base_url, timeout=120)
    measure = {"engine": engine, "voice_llm": lambda: _grpc_ttft(triton, "voice_llm", body),
               "voice": lambda: _grpc_ttft(triton, "voice", voice_body), "http": lambda: _http_ttft(http, args.max_tokens)}
    for layer in LAYERS:  # warm-up
        measure[layer]()
    times: dict[str, list[float]] = {layer: [] for layer in LAYERS}
    for _ in range(args.n):
        for layer in LAYERS:
            times[layer].append(measure[layer]())
    llm.shutdown()
    medians = {layer: statistics.median(values) for layer, values in times.items()}
    print(f"TTFT by layer, {args.n} requests each, round-robin (medians, ms)")
    previous = None
    for layer in LAYERS:
        added = "" if previous is None else f"  (+{(medians[layer] - medians[previous]) * 1000:6.1f} over {previous})"
        print(f"  {layer:<10} {medians[layer] * 1000:7.1f}{added}")
        previous = layer
    print(f"  serving overhead (http - engine): {(medians['http'] - medians['engine']) * 1000:.1f} ms")
    if args.result_json:
        with open(args.result_json, "w") as out:
            json.dump({"config": vars(args), "ttft_s": times, "median_s": medians}, out, indent=1)


if __name__ == "__main__":
    main()
