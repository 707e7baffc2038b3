"""An open /v1/realtime session whose pipeline is put to sleep (POST /v1/admin/pipelines/voice/sleep)
gets Triton internals as a server failure instead of the documented `pipeline_sleeping` refusal.

Expected (docs/reliability.md "Sleep and wake", docs/pipelines.md "Realtime voice"): a sleeping pipeline
refuses its work with `pipeline_sleeping` (HTTP 503; new realtime sessions: an error event with code
`pipeline_sleeping`, then close 1013). A session that was already open should be told the same way
(error code `pipeline_sleeping`, or closed with 1013), and after wake its turn detection should work again.

Observed: `response.create` -> `response.created`, then (after several seconds) an `error` event with
code `inference_error` and type server_error ("inference failed: Request for unknown model: 'voice' has
no available versions"), `response.done` status failed; appending audio gives `vad_error` ("Request for
unknown model: 'voice_vad' ..."). After wake, the same session's server VAD is checked too.

Side effects: sleeps and then wakes the `voice` pipeline (the wake takes ~15-60 s). Exit 1 while the
fault is present, 0 when fixed. Env: BASE_URL (default http://127.0.0.1:21000).
"""
import asyncio
import base64
import json
import os
import sys
import time

import httpx
import numpy as np
import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
WS = BASE.replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime?model=voice"


async def events(ws, seconds, until=None):
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            event = json.loads(await asyncio.wait_for(ws.recv(), end - time.monotonic()))
        except (asyncio.TimeoutError, websockets.ConnectionClosed):
            break
        out.append(event)
        if until and event["type"] in until:
            break
    return out


def errors(evs):
    return [(e["error"].get("code"), e["error"].get("type"), e["error"].get("message", "")[:120]) for e in evs
            if e["type"] == "error"]


def tone_speech():
    """~1.5 s of a loud voiced-like signal at 24 kHz (PCM16), framed by silence, from the server's own TTS."""
    r = httpx.post(BASE + "/v1/audio/speech", timeout=120, json={"model": "tts", "voice": "alloy",
                   "input": "Hello there, how are you today?", "response_format": "pcm"})
    r.raise_for_status()
    pcm = np.frombuffer(r.content, dtype=np.int16)
    return np.concatenate([np.zeros(12000, np.int16), pcm, np.zeros(48000, np.int16)])


async def main() -> int:
    speech = tone_speech()
    http = httpx.AsyncClient(timeout=300)
    bad = []
    try:
        async with websockets.connect(WS, max_size=None) as ws:
            await events(ws, 2)
            r = await http.post(BASE + "/v1/admin/pipelines/voice/sleep")
            print("sleep voice:", r.status_code)
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                      "content": [{"type": "input_text", "text": "hi"}]}}))
            await ws.send(json.dumps({"type": "response.create"}))
            t = time.monotonic()
            evs = await events(ws, 30, until=("response.done",))
            errs = errors(evs)
            print(f"response.create while sleeping ({time.monotonic() - t:.1f} s): errors {errs}")
            if not any(code == "pipeline_sleeping" for code, _, _ in errs):
                bad.append(f"response.create on a sleeping pipeline: expected pipeline_sleeping, got {errs}")
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(np.zeros(4800, np.int16).tobytes()).decode()}))
            errs = errors(await events(ws, 5))
            print("append while sleeping: errors", errs)
            if any(code in ("vad_error", "inference_error", "internal_error") for code, _, _ in errs):
                bad.append(f"append on a sleeping pipeline: server error {errs}")
            t = time.monotonic()
            r = await http.post(BASE + "/v1/admin/pipelines/voice/wake")
            print(f"wake voice: {r.status_code} in {time.monotonic() - t:.1f} s")
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            await events(ws, 1)
            for i in range(0, len(speech), 2400):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(speech[i:i + 2400].tobytes()).decode()}))
            evs = await events(ws, 20, until=("input_audio_buffer.committed",))
            kinds = [e["type"] for e in evs]
            print("after wake, spoken turn in the same session:", [k for k in kinds if "delta" not in k][:8], errors(evs))
            if "input_audio_buffer.speech_started" not in kinds:
                bad.append(f"after wake, the open session's VAD does not detect speech: {errors(evs) or kinds[:6]}")
    finally:
        r = await http.post(BASE + "/v1/admin/pipelines/voice/wake")   # leave the server as found
        await http.aclose()
    for line in bad:
        print("BAD", line)
    print("expected: pipeline_sleeping for the open session, and a working session after wake")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
