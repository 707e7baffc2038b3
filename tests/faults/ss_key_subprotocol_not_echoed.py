"""Speech stream: with `--api-key`, a browser cannot connect with the documented key subprotocol. The server takes
the key from `Sec-WebSocket-Protocol: openai-insecure-api-key.KEY` (auth.websocket_authorized: "browsers cannot set
headers") but accepts without choosing a subprotocol, so its 101 has no Sec-WebSocket-Protocol header. A browser
fails such a handshake (WHATWG WebSockets: when protocols were requested and the response names none, "fail the
WebSocket connection"; Chrome: "Sent non-empty 'Sec-WebSocket-Protocol' header but no response was received").
Python's websockets accepts it, which is why the tests pass.

Wrong: frontend/routes/speech_stream.py `speech_stream`: `await websocket.accept()` (the realtime route picks
"realtime", which browsers offer next to the key protocol; this route has no protocol of its own to pick).
Expected: the 101 names one of the offered protocols (e.g. the `openai-insecure-api-key.*` one it authorized with),
so `new WebSocket(url, ["openai-insecure-api-key.KEY"])` opens.
Needs a server started with `--api-key K` (OPENAI_API_KEY overrides K). Exit 1 while the fault is present, 0 when fixed.
"""
import asyncio, json, os, sys

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:26000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/audio/speech/stream"
KEY = os.environ.get("OPENAI_API_KEY", "K")


async def main():
    offered = f"openai-insecure-api-key.{KEY}"
    async with websockets.connect(WS, subprotocols=[offered]) as ws:
        chosen = ws.response.headers.get("sec-websocket-protocol")
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm"}))
        await ws.send(json.dumps({"type": "session.close"}))
        try:
            first = await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as exc:
            first = f"closed {exc.rcvd.code if exc.rcvd else None}"
    if isinstance(first, str) and "invalid_api_key" in first:
        print(f"the server refused the key {KEY!r}: start it with --api-key {KEY} (or set OPENAI_API_KEY)")
        return 2
    if chosen not in (offered,):
        print(f"FAULT: offered Sec-WebSocket-Protocol [{offered!r}], the 101 answered {chosen!r} "
              "(a browser fails this handshake); expected the offered protocol echoed")
        return 1
    print(f"ok: the 101 names {chosen!r}")
    return 0


sys.exit(asyncio.run(main()))
