"""Realtime `session.update` / `response.create` silently accept fields that change the answer's contract
and that the server never honours, while the HTTP routes refuse the same features with a 400:

- `session.tool_choice: "required"` (and a forced function `{"type": "function", "name": ...}`) and
  `response.tool_choice: "required"`: the model is told it MUST call a tool; the response is plain
  speech/text. Chat refuses `tool_choice` other than "none" (docs/reliability.md "Fields that would change
  the answer": never silently dropped); realtime refuses `tools` but not `tool_choice`.
- `session.include: ["item.input_audio_transcription.logprobs"]`: the transcription events never carry
  `logprobs`; `/v1/audio/transcriptions` refuses `include[]` with 400 ("log probabilities are not returned").

Expected: an `error` event (`unsupported_feature`, param naming the field) as for `tools`, `prompt`, ...
Observed: `session.updated` / a normal response, the field dropped.

Exit 1 while any of them is accepted, 0 when all are refused. Env: BASE_URL (default http://127.0.0.1:21000).
"""
import asyncio
import json
import os
import sys
import time

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
WS = BASE.replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime?model=voice"
PROBES = {
    "session.tool_choice required": {"type": "session.update",
                                     "session": {"type": "realtime", "tool_choice": "required"}},
    "session.tool_choice forced function": {"type": "session.update", "session": {
        "type": "realtime", "tool_choice": {"type": "function", "name": "get_weather"}}},
    "session.include logprobs": {"type": "session.update", "session": {
        "type": "realtime", "include": ["item.input_audio_transcription.logprobs"]}},
    "response.tool_choice required": {"type": "response.create", "response": {
        "tool_choice": "required", "output_modalities": ["text"], "max_output_tokens": 4}},
}


async def answer(ws, until=("session.updated", "error", "response.done"), seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        event = json.loads(await asyncio.wait_for(ws.recv(), end - time.monotonic()))
        if event["type"] in until:
            return event
    return None


async def main() -> int:
    bad = 0
    async with websockets.connect(WS, max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                  "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]}}))
        for name, event in PROBES.items():
            await ws.send(json.dumps(event))
            got = await answer(ws)
            refused = got is not None and got["type"] == "error"
            bad += not refused
            what = got["error"]["code"] if refused else (got or {}).get("type")
            if got and got["type"] == "response.done":
                what += f" (status {got['response']['status']}, output {[i.get('type') for i in got['response']['output']]})"
            print(f"{'ok ' if refused else 'BAD'} {name}: {what}")
            if got and got["type"] == "session.updated":   # undo, so the next probe starts clean
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime",
                                          "tool_choice": "auto", "include": None}}))
                await answer(ws)
    print("expected: an error event (unsupported_feature) for each, as for session.tools")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
