"""OPEN (thirteenth outside test): a realtime session keeps every conversation item it is sent, with no bound on
their number or their text in all. Each text part is now at most --max-text-chars (131 072) characters, but a client
may send item after item: 400 items of 130 000 characters (52 MB of text) raised the frontend's resident memory
by 45 MB until the session closed (measured on the thirteenth test's server), and nothing bounds their number, so
a few sessions sending thousands exhaust the frontend that serves everyone. Only the newest HISTORY_CHARS of them
are ever sent to the model. Items with `input_audio` parts are the same kind (each frame up to 16 MiB of base64, held
as float32 until the session's one-at-a-time transcription reaches it): a fix must bound what a session holds in all,
text and audio. Exits 1 while the session accepts all the text items (a bound would refuse, or drop the oldest with
conversation.item.deleted as OpenAI's truncation does).

Server A of README.md (voice); BASE_URL defaults to http://127.0.0.1:21000, API_KEY to none.
"""
from __future__ import annotations

import json
import os
import sys

import websockets.sync.client

BASE_URL = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
ITEMS, CHARS = 400, 130_000


def main() -> int:
    headers = {"Authorization": f"Bearer {os.environ['API_KEY']}"} if os.environ.get("API_KEY") else {}
    url = BASE_URL.replace("http", "ws") + "/v1/realtime?model=voice"
    with websockets.sync.client.connect(url, additional_headers=headers, max_size=None) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        kept = 0
        for i in range(ITEMS):
            ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * CHARS}]}}))
            while (event := json.loads(ws.recv(timeout=60)))["type"] != "conversation.item.done":
                if event["type"] != "conversation.item.added":   # an error (refused) or item.deleted (truncated)
                    print(f"bounded at item {i}: {json.dumps(event)[:300]}")
                    return 0
            kept += 1
    print(f"FAULT: all {kept} items of {CHARS} characters were kept ({kept * CHARS / 1e6:.0f} MB of text in one session)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
