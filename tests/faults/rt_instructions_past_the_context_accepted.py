"""Realtime: `session.update` accepts `instructions` that can never fit the LLM's context (45,000 characters,
15,016 tokens against SmolLM2's 8,192): `session.updated` answers, and then every response of the session fails
with `context_length_exceeded` (response.done failed), also with an empty conversation.

Wrong: frontend/realtime/session.py `_on_session_update` / config.check_length only bound instructions by
--max-text-chars (131072 characters by default), not by what the pipeline can take; the pipeline refuses them at
each response.
Expected (docs/pipelines.md, Realtime voice: "`session.update` and `response.create` are checked whole before
anything changes or starts, so a bad value is never accepted now and failed later"; HTTP chat refuses the same
system prompt with a 400 at the request): an `error` event naming `session.instructions` (code e.g.
context_length_exceeded / invalid_value, the update's event_id) and the session unchanged; likewise
`response.instructions`.
Reproduce: session.update {"instructions": "Be nice. " * 5000} -> session.updated; a user text item;
response.create -> error context_length_exceeded, response.done failed.
Exit 1 while the update is accepted and responses then fail, 0 when the update is refused (or responses work).
"""
import asyncio, json, os, sys

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/realtime?model=voice"


async def main():
    async with websockets.connect(WS, max_size=None) as ws:
        json.loads(await ws.recv())  # session.created
        await ws.send(json.dumps({"type": "session.update", "event_id": "su1", "session": {
            "type": "realtime", "output_modalities": ["text"], "instructions": "Be nice. " * 5000,
            "audio": {"input": {"turn_detection": None}}}}))
        answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if answer["type"] == "error":
            print(f"ok: refused at session.update: {answer['error']}")
            return 0
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}}))
        await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 5}}))
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            if event["type"] == "response.done":
                status = event["response"]["status"]
                break
    if status == "failed":
        print(f"FAULT: session.update accepted instructions past the context ({answer['type']}); the response then "
              f"failed: {event['response']['status_details']}")
        return 1
    print(f"ok: accepted and the response {status}")
    return 0


sys.exit(asyncio.run(main()))
