"""Server A. While a pipeline is being put to sleep with requests still in flight, GET /health answers 503 for the
whole server ("model(s) not ready" naming the sleeping pipeline's model, then "tritonserver is not ready") for as
long as those requests take, although the other pipelines keep serving (tts answers 200 meanwhile) and /v1/models
already shows the pipeline as sleeping.

Steps: two streamed-off voice chats with audio (max_tokens 60) in flight; POST /v1/admin/pipelines/voice/sleep;
poll GET /health until the sleep call returns; then wake voice again.
Expected: /health judges only awake pipelines (docs/reliability.md: "/health judges only awake pipelines and lists
the sleeping ones"; README "Operations": 200 when every model of the awake pipelines is ready) — so 200 while tts,
asr and qwen3_omni are ready. A load balancer otherwise pulls a server that is serving.
Actual: 503 {"status": "unavailable", ..., "error": "tritonserver is not ready"} during the drain (~25 s here).
"""
import asyncio, os, sys, time
import httpx

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")


async def main() -> int:
    bad = []
    async with httpx.AsyncClient(timeout=300) as h:
        body = {"model": "voice", "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"},
                "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": 60}
        reqs = [asyncio.create_task(h.post(B + "/v1/chat/completions", json=body)) for _ in range(2)]
        await asyncio.sleep(3)
        sleep = asyncio.create_task(h.post(B + "/v1/admin/pipelines/voice/sleep"))
        try:
            while not sleep.done():
                health = await h.get(B + "/health")
                tts = await h.post(B + "/v1/audio/speech", json={"model": "tts", "voice": "alloy", "input": "hi",
                                                                  "response_format": "pcm"})
                print("health", health.status_code, health.text[:120], "| tts", tts.status_code)
                if health.status_code != 200 and tts.status_code == 200:
                    bad.append(health.text)
                await asyncio.sleep(2)
            await sleep
            await asyncio.gather(*reqs, return_exceptions=True)
        finally:
            await h.post(B + "/v1/admin/pipelines/voice/wake")
    if bad:
        print(f"FAULT: /health 503 {len(bad)} times while the other pipelines served: {bad[-1][:200]}")
        return 1
    return 0

sys.exit(asyncio.run(main()))
