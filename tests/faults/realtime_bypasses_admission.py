"""Realtime responses bypass the pipeline's admission control (`--max-inflight` / `--max-queue`).

docs/reliability.md "Overload control": each pipeline runs at most `--max-inflight` requests (default 4),
up to `--max-queue` more wait, and beyond both a request gets 429 at once. Every realtime response is a
request of the same `voice` pipeline (one gRPC stream to the `voice` model), but `frontend/realtime`
never enters `admission`: N sessions that each `response.create` at once put N requests on the pipeline,
none refused or queued, and `omni_frontend_inflight_requests{pipeline="voice"}` stays 0 while they run,
so HTTP clients are admitted on top of them and the 2-core machine is oversubscribed without bound.

Expected: at most `--max-inflight` (default 4) voice requests run at once; extra realtime responses wait
or fail with a rate-limit `error` event (e.g. code `pipeline_overloaded`), and they count in the
frontend gauges. Observed: Triton's `omni_inflight_requests{model="voice"}` reaches N (8 here).

Exit 1 while more than MAX_INFLIGHT (env, default 4) run at once, 0 otherwise.
Env: BASE_URL (default http://127.0.0.1:21000), TRITON_METRICS_URL (default http://127.0.0.1:21003/metrics).
"""
import asyncio
import json
import os
import re
import sys
import time

import httpx
import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
METRICS = os.environ.get("TRITON_METRICS_URL", "http://127.0.0.1:21003/metrics")
WS = BASE.replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime?model=voice"
MAX_INFLIGHT = int(os.environ.get("MAX_INFLIGHT", "4"))
SESSIONS = 8


def gauge(text: str, pattern: str) -> float:
    found = re.search(pattern + r"\s+([0-9.eE+-]+)", text)
    return float(found.group(1)) if found else 0.0


async def session(ready: asyncio.Event, results: list):
    async with websockets.connect(WS, max_size=None) as ws:
        await ws.recv()
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "Tell me about the sea in detail."}]}}))
        await ready.wait()
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 48}}))
        errors = []
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 300))
            if event["type"] == "error":
                errors.append(event["error"]["code"])
            if event["type"] == "response.done":
                results.append((event["response"]["status"], errors))
                return


async def main() -> int:
    ready, results = asyncio.Event(), []
    tasks = [asyncio.create_task(session(ready, results)) for _ in range(SESSIONS)]
    await asyncio.sleep(2)
    ready.set()
    peak_triton = peak_frontend = 0.0
    async with httpx.AsyncClient(timeout=10) as http:
        while not all(t.done() for t in tasks):
            triton = (await http.get(METRICS)).text
            frontend = (await http.get(BASE + "/metrics")).text
            peak_triton = max(peak_triton, gauge(triton, r'omni_inflight_requests\{model="voice"\}'))
            peak_frontend = max(peak_frontend, gauge(frontend, r'omni_frontend_inflight_requests\{pipeline="voice"\}'))
            await asyncio.sleep(0.2)
    await asyncio.gather(*tasks, return_exceptions=True)
    print(f"{SESSIONS} realtime sessions, one response.create each, at once")
    print("response results:", results)
    print(f"peak Triton omni_inflight_requests{{model=voice}}: {peak_triton:g}; "
          f"peak frontend omni_frontend_inflight_requests{{pipeline=voice}}: {peak_frontend:g}")
    print(f"expected: at most {MAX_INFLIGHT} voice requests at once (--max-inflight), the rest queued or refused")
    return 1 if peak_triton > MAX_INFLIGHT else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
