"""Realtime: `conversation.item.retrieve` of a user audio item answers without the audio: the
`input_audio` content part of `conversation.item.retrieved` has only `transcript`, no `audio` (for an item
committed from the buffer and for one created with `conversation.item.create` carrying base64 audio alike).

Wrong: frontend/realtime/session.py:390 drops a part's audio once transcribed (`part.audio = None`) and
frontend/realtime/conversation.py:30 (`Part.wire`) never writes `audio`.
Expected (OpenAI `ConversationItemRetrieveEvent`: "retrieve the server's representation of a specific item ...
useful, for example, to inspect user audio after noise cancellation and VAD"; the user message content part's
`audio`: "Base64-encoded audio bytes (for input_audio), ... parsed as the format specified in the session input
audio type configuration"): the retrieved item's input_audio part carries the item's audio (in the session's
input format). If keeping audio is not wanted, the limitation should at least be documented with the retrieve
event in docs/pipelines.md (it is not).
Reproduce: session with turn_detection null; append 2.4 s of speech (POST /v1/audio/speech pcm 24 kHz), commit,
wait for the transcription, conversation.item.retrieve the committed item_id.
Exit 1 while the retrieved part has no audio, 0 when it has.
"""
import asyncio, base64, json, os, sys, urllib.request

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/realtime?model=voice"


def speech(text):
    body = json.dumps({"model": "tts", "input": text, "voice": "alloy", "response_format": "pcm"}).encode()
    req = urllib.request.Request(BASE + "/v1/audio/speech", body, {"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=120).read()  # PCM16 24 kHz


async def until(ws, kind):
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if event["type"] == "error":
            raise SystemExit(f"unexpected error {event['error']}")
        if event["type"] == kind:
            return event


async def main():
    pcm = speech("What is the capital of France?")
    async with websockets.connect(WS, max_size=None) as ws:
        json.loads(await ws.recv())  # session.created
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
        await until(ws, "session.updated")
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        item_id = (await until(ws, "input_audio_buffer.committed"))["item_id"]
        await until(ws, "conversation.item.input_audio_transcription.completed")
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": item_id}))
        part = (await until(ws, "conversation.item.retrieved"))["item"]["content"][0]
    if not part.get("audio"):
        print(f"FAULT: retrieved input_audio part has no audio: {part}")
        return 1
    print(f"ok: retrieved part carries {len(base64.b64decode(part['audio']))} bytes of audio")
    return 0


sys.exit(asyncio.run(main()))
