"""A realtime response that is cancelled (`response.cancel`; barge-in takes the same path) leaves its
assistant item open: the client got `response.output_item.added`, `conversation.item.added` and
`response.content_part.added`, but never the matching `response.output_audio.done` /
`response.output_audio_transcript.done`, `response.content_part.done`, `response.output_item.done`
or `conversation.item.done`; only `response.done` (status cancelled, `usage: null`) follows.

Expected (as OpenAI's Realtime API does on cancel/interruption): each opened part and item is closed
(`*.done` events, item status `incomplete`) before `response.done`, so a client that tracks items by
their added/done events does not keep a dangling item. `frontend/realtime/session.py`: `_Output.finish`
only runs on normal completion.

Exit 1 while the done events are missing, 0 when present. Env: BASE_URL (default http://127.0.0.1:21000).
"""
import asyncio
import json
import os
import sys
import time

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
WS = BASE.replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime?model=voice"
CLOSING = ("response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
           "response.output_item.done", "conversation.item.done")


async def main() -> int:
    async with websockets.connect(WS, max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "Tell me a long story about dragons."}]}}))
        await ws.send(json.dumps({"type": "response.create"}))
        seen, cancelled = [], False
        end = time.monotonic() + 120
        while time.monotonic() < end:
            event = json.loads(await asyncio.wait_for(ws.recv(), end - time.monotonic()))
            seen.append(event)
            if event["type"] == "response.output_audio.delta" and not cancelled:
                await ws.send(json.dumps({"type": "response.cancel"}))
                cancelled = True
            if event["type"] == "response.done":
                break
    kinds = [e["type"] for e in seen]
    done = seen[-1]["response"] if seen and seen[-1]["type"] == "response.done" else {}
    print("events (deltas left out):", [k for k in kinds if not k.endswith(".delta")])
    print("response.done status:", done.get("status"), "usage:", done.get("usage"))
    if "response.output_item.added" not in kinds or done.get("status") != "cancelled":
        print("could not cancel a response that had opened its item (finished too soon?)")
        return 1
    item_id = next(e["item"]["id"] for e in seen if e["type"] == "response.output_item.added")
    closed = [e["type"] for e in seen if (e.get("item_id") or (e.get("item") or {}).get("id")) == item_id]
    missing = [k for k in CLOSING if k not in closed]
    print("missing closing events:", missing or "none")
    print("expected: the opened part/item closed (status incomplete) before response.done")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
