"""Server A. Since unknown request fields are refused by the pipeline (commit 57e4823), a streamed chat request with a
field the pipeline does not read gets a 400 when the pipeline is idle but, when it has to queue, a 200 SSE head, an
assistant role chunk, a wait for a slot (up to --max-queue-wait, 30 s), and only then an error data event. The same
invalid request is accepted or refused depending on load, and it takes a queue place meanwhile. (/v1/audio/speech
with stream_format "sse" behaves the same.)

Steps: fill `voice` with 5 long non-streamed chats (4 run, 1 queues); POST a streamed chat with
extra field "min_tokens": 5 (the voice pipeline refuses it with 400 unsupported_parameter when idle).
Expected: 400 unsupported_parameter naming min_tokens before the 200 head, whatever the load (README "Operations":
unsupported fields are rejected naming the field, checked before any model work; openai_wire.md: never a 200 carrying
an error body).
Actual: 200 text/event-stream, role chunk, then (after the wait) data: {"error": {... "unsupported_parameter"}}.
"""
import asyncio, os, sys, time
import httpx

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
LONG = {"model": "voice", "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"},
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": 16}
BAD = {"model": "voice", "modalities": ["text"], "stream": True, "min_tokens": 5,
       "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def main() -> int:
    async with httpx.AsyncClient(timeout=300) as h:
        idle = await h.post(B + "/v1/chat/completions", json=BAD)
        print("idle:", idle.status_code, idle.text[:160])
        load = [asyncio.create_task(h.post(B + "/v1/chat/completions", json=LONG)) for _ in range(5)]
        await asyncio.sleep(2)
        t0 = time.time()
        async with h.stream("POST", B + "/v1/chat/completions", json=BAD) as r:
            text = (await r.aread()).decode()
        print("busy:", r.status_code, round(time.time() - t0, 1), "s", text[-220:])
        for t in load:
            t.cancel()
        await asyncio.gather(*load, return_exceptions=True)
    if idle.status_code == 400 and r.status_code == 200 and "unsupported_parameter" in text:
        print("FAULT: same invalid request: 400 when idle, 200 + error event when queued")
        return 1
    return 0

sys.exit(asyncio.run(main()))
