"""Speech stream: a sentence whose speech has no samples, with response_format mp3 / opus / aac, kills the session:
after its `audio.start` nothing more comes (no binary frame, no `audio.done`, no `error`), every later sentence and
utterance is never spoken and the connection is never closed (not even by the idle timeout: text is still queued).

Trigger: "[](abc)" has letters (the pipeline takes it) but `markup.speakable` makes it "" (a Markdown link without
text), so the pipeline answers with no audio; any text the pipeline speaks as nothing does the same.
Wrong: frontend/routes/speech_stream.py `_speak` encodes the empty PCM with `audio_codec.encode`, which raises
av.error.MemoryError for mp3/opus/aac (0 samples); only APIError is caught, so the speaking task dies (logged
"speaking failed" only when the client leaves) and the reader goes on accepting text nobody will speak.
Expected (module docstring): every sentence gets audio.start, its audio, audio.done ("a failure is an error event
(the session goes on)"); the next utterance is spoken and each utterance ends with session.done.
Exit 1 while the fault is present, 0 when fixed.
"""
import asyncio, json, os, sys

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:26000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/audio/speech/stream"
KEY = os.environ.get("OPENAI_API_KEY")


async def run(fmt):
    headers = {"authorization": f"Bearer {KEY}"} if KEY else {}
    async with websockets.connect(WS, max_size=None, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": fmt}))
        for text in ("[](abc)", "Then a real sentence."):
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
        seen, done = [], 0
        try:
            while done < 2:
                message = await asyncio.wait_for(ws.recv(), 40)
                if isinstance(message, bytes):
                    seen.append(f"<{len(message)} bytes>")
                    continue
                event = json.loads(message)
                seen.append(event["type"])
                done += event["type"] == "session.done"
        except asyncio.TimeoutError:
            seen.append("<nothing for 40 s>")
        return done == 2, seen


async def main():
    failed = 0
    for fmt in ("mp3", "opus", "aac"):
        ok, seen = await run(fmt)
        print(f"{fmt}: {'ok' if ok else 'FAULT'}: {' '.join(seen)}")
        failed += not ok
    if failed:
        print("expected: audio.start, audio.done (or an error event) for the silent sentence, then the second "
              "utterance's sentence and two session.done")
    return 1 if failed else 0


sys.exit(asyncio.run(main()))
