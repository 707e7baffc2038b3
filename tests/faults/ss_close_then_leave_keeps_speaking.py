"""Speech stream: after `session.close`, a client that leaves is not noticed: the sentence being spoken keeps
running in Triton to its end (in five runs it ended 5, 7, 44, 71 and 92 s after the client left; without session.close ~1 s), while the frontend's admission gauge
already says 0 in flight (its slot was given back), so other requests are admitted on top of it.

Reproduce: stream_audio pcm, split_granularity utterance, ~1400 characters, input.done, session.close; wait for
the first audio frame, then drop the TCP connection. Watch Triton's `omni_inflight_requests{model="tts"}`.
Without session.close the same drop cancels the request in Triton within ~1 s.
Wrong: frontend/routes/speech_stream.py `run`: after session.close it `await speaker` without reading the socket,
so the disconnect is seen only when the next send fails; that exception leaves `_speak`'s `async for` over
`pipeline_stream.events(...)` without closing the generator (no aclose), so the gRPC stream is not cancelled
(`TritonClient.stream`'s finally runs only when the orphaned generator is collected).
Expected (docs/pipelines.md: "a client that leaves has its sentence cancelled in Triton"): the Triton request ends
within a few seconds of the client leaving, whether or not it had sent session.close.
Exit 1 while the fault is present, 0 when fixed. TRITON_METRICS_URL defaults to http://127.0.0.1:26003/metrics.
"""
import asyncio, json, os, sys, time, urllib.request

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:26000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/audio/speech/stream"
TRITON_METRICS = os.environ.get("TRITON_METRICS_URL", "http://127.0.0.1:26003/metrics")
KEY = os.environ.get("OPENAI_API_KEY")
TEXT = "This is a fairly long sentence that keeps going with many words so that speaking it takes a while. " * 14


def tts_in_flight() -> int:
    text = urllib.request.urlopen(TRITON_METRICS, timeout=10).read().decode()
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith('omni_inflight_requests{model="tts"}'))


def frontend_in_flight() -> str:
    text = urllib.request.urlopen(BASE + "/metrics", timeout=10).read().decode()
    return next((line.split()[-1] for line in text.splitlines()
                 if line.startswith('omni_frontend_inflight_requests{pipeline="tts"}')), "?")


async def main():
    if tts_in_flight():
        print("tts busy before the test; run it on an idle server")
        return 2
    headers = {"authorization": f"Bearer {KEY}"} if KEY else {}
    ws = await websockets.connect(WS, max_size=None, additional_headers=headers)
    await ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm",
                              "stream_audio": True, "split_granularity": "utterance"}))
    await ws.send(json.dumps({"type": "input.text", "text": TEXT}))
    await ws.send(json.dumps({"type": "input.done"}))
    await ws.send(json.dumps({"type": "session.close"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 60), bytes):
        pass
    ws.transport.abort()   # the client is gone
    left = time.time()
    while time.time() - left < 4:
        await asyncio.sleep(1)
        if not tts_in_flight():
            print(f"ok: the Triton request ended {time.time() - left:.1f} s after the client left")
            return 0
    print(f"FAULT: 4 s after the client left (after session.close) Triton still has {tts_in_flight()} tts "
          f"request(s) in flight, while the frontend's inflight gauge says {frontend_in_flight()}")
    while tts_in_flight() and time.time() - left < 180:
        await asyncio.sleep(1)
    print(f"   it ended {time.time() - left:.0f} s after the client left; expected: cancelled within a few seconds "
          "(as without session.close)")
    return 1


sys.exit(asyncio.run(main()))
