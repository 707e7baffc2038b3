"""Speech stream: the idle timeout counts the time the server spent speaking. A client that sends an utterance and
then listens is closed with `idle_timeout` 30 s after its last message, however recently its speech ended: here
a few seconds after its `session.done` (with speech taking 31-59 s, within 1 s of it).

Reproduce: stream_audio pcm, two long sentences in one utterance (speaking them takes ~5-25 s on 2 cores),
input.done, then no message; note when session.done arrives and when the server closes.
Wrong: frontend/routes/speech_stream.py `_receive`: `asyncio.wait_for(receive(), IDLE_TIMEOUT_S)` runs from the
last message; when it fires while something is spoken it just waits another IDLE_TIMEOUT_S, and when it fires
after the speech ended it closes at once, so the time left after the speech is 30 - (speaking time mod 30) s.
Expected (module docstring: "A connection with no message for IDLE_TIMEOUT_S while nothing is being spoken gets an
`idle_timeout` error"; docs/pipelines.md: "30 s without a message while nothing is spoken"): the idle time counts
from the later of the last message and the end of the last sentence, so the close comes ~30 s after session.done.
Exit 1 while the fault is present, 0 when fixed.
"""
import asyncio, json, os, sys, time

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:26000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/audio/speech/stream"
KEY = os.environ.get("OPENAI_API_KEY")
SENTENCE = "This is a fairly long sentence that keeps going with many words so that speaking it takes a while. "


async def main():
    headers = {"authorization": f"Bearer {KEY}"} if KEY else {}
    async with websockets.connect(WS, max_size=None, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm",
                                  "stream_audio": True}))
        await ws.send(json.dumps({"type": "input.text", "text": SENTENCE * 2}))
        await ws.send(json.dumps({"type": "input.done"}))
        sent = time.time()
        spoken, idle = None, None
        try:
            while True:
                message = await asyncio.wait_for(ws.recv(), 120)
                if isinstance(message, str):
                    event = json.loads(message)
                    if event["type"] == "session.done":
                        spoken = time.time()
                    elif event["type"] == "error":
                        idle = event
        except websockets.ConnectionClosed:
            closed = time.time()
    if spoken is None:
        print(f"FAULT(other): closed {closed - sent:.1f} s after input.done before session.done ({idle})")
        return 1
    after = closed - spoken
    print(f"speaking took {spoken - sent:.1f} s; closed {closed - sent:.1f} s after the last message, "
          f"{after:.1f} s after session.done ({idle and idle.get('code')})")
    if after < 29:
        print(f"FAULT: closed for idleness {after:.1f} s after the speech ended; expected ~30 s of no message "
              "while nothing is spoken")
        return 1
    print("ok")
    return 0


sys.exit(asyncio.run(main()))
