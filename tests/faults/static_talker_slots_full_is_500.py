"""Fault (outside test 16): with the static talker, a chat with audio past the talker's slots is a 500.

Server S (from the checkout's root; the script writes the deploy file):
  ./scripts/serve --deploy /tmp/brk16_static_cpu.yaml --port 43000 --triton-grpc-port 43001 --triton-metrics-port 43003
(static engine, co-located layout, CPU, tiny checkpoint; thinker and talker `max_running: 2`; the frontend's default
`--max-inflight 4 --max-queue 4`.)

What is wrong: the thinker's static engine queues requests beyond its slots, but `Talker.add_request`
(`python_backends/qwen3_omni/talker.py`) raises "the talker holds its maximum of 2 requests" (a RequestError 503
`overloaded` that reaches the client as a 500 `inference_error`: "inference failed: qwen3_omni: RuntimeError: the
talker holds its maximum of 2 requests"). Four concurrent non-streamed chats with `modalities: ["text", "audio"]`
(the frontend admits 4) -> 3 x 200 and 1 x 500, every time; streamed ones get a 200 head and an error event. It also
hits right after clients disconnect from streams (the talker's slots are freed a little later). With the H200 deploy
(talker max_running 32) the same happens once `--max-inflight` exceeds 32, as docs/gpu.md suggests raising it to
"the engine's capacity". `scripts/bench --workload chat-audio --model qwen3_omni --voice ethan --max-concurrency 4`
against server S: 5 of 8 requests failed with this error.
What is right: a request beyond the talker's slots waits for one (as the thinker's do), or is refused as the frontend's
overload is (429 with Retry-After, docs/reliability.md); never a 5xx. (Stage layout: a 503 `overloaded`.)
Exits 1 while any of the rounds gets a 5xx, 0 once fixed. Env BASE_URL (default http://127.0.0.1:43000).
"""
import asyncio
import os
import sys

import httpx

YAML = """pipeline: qwen3_omni
layout: colocated
checkpoint: qwen3_omni_tiny
stages:
  thinker: {device: cpu, engine: static, max_running: 2, max_len: 128, prefill_chunk: 32, max_tokens: 64}
  talker: {device: cpu, engine: static, max_running: 2, max_len: 512, max_frames: 200}
  code2wav: {device: cpu, chunk_frames: 25, first_chunk_frames: 5, left_context_frames: 25}
  orchestrator: {device: cpu, default_voice: ethan}
"""
BASE = os.environ.get("BASE_URL", "http://127.0.0.1:43000")


def body(i: int, stream: bool = False) -> dict:
    return {"model": "qwen3_omni", "messages": [{"role": "user", "content": f"Tell me a story {i}"}],
            "max_tokens": 40, "temperature": 0, "stream": stream, "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"}}


async def main() -> int:
    pathlib_path = "/tmp/brk16_static_cpu.yaml"
    if not os.path.exists(pathlib_path):
        with open(pathlib_path, "w") as f:
            f.write(YAML)
    async with httpx.AsyncClient(timeout=300) as client:
        try:
            (await client.get(f"{BASE}/health")).raise_for_status()
        except httpx.HTTPError as exc:
            print(f"server S is not up at {BASE} ({exc}); start it as the docstring says")
            return 2
        bad = 0
        for rnd in range(3):
            replies = await asyncio.gather(*[client.post(f"{BASE}/v1/chat/completions", json=body(i))
                                             for i in range(4)])
            codes = [r.status_code for r in replies]
            errors = [r.json()["error"]["message"][:100] for r in replies if r.status_code >= 500]
            print(f"round {rnd}: {codes} {errors}")
            bad += len(errors)
    print("FAULT present: a chat past the talker's slots is a 5xx" if bad else "fixed")
    return 1 if bad else 0


sys.exit(asyncio.run(main()))
