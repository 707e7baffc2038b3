"""Speech stream: a `session.config` sent between utterances "to change it" replaces the whole config: every field
it leaves out falls back to its default. Changing only the speed (`{"type": "session.config", "speed": 1.25}`)
also turns the session's response_format pcm into wav, its voice into the pipeline's default and its model into the
default speech pipeline, silently (no error, the next audio.start just says format "wav").

Wrong: frontend/routes/speech_stream.py `_configure`: `StreamConfig.model_validate(fields)` of the new message
alone, then `self.config = config`.
Expected (module docstring: session.config "again between utterances to change it"; docs/pipelines.md: "sent again
between utterances to change them"): the fields a later session.config names change, the others keep their values
(as OpenAI's session.update), so the next utterance is pcm in the chosen voice at the new speed. (If replacing is
meant, the docs must say that a later session.config resets every field it omits.)
Exit 1 while the fault is present, 0 when fixed.
"""
import asyncio, json, os, sys

import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:26000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/audio/speech/stream"
KEY = os.environ.get("OPENAI_API_KEY")


async def main():
    headers = {"authorization": f"Bearer {KEY}"} if KEY else {}
    async with websockets.connect(WS, max_size=None, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "nova", "response_format": "pcm"}))
        await ws.send(json.dumps({"type": "session.config", "speed": 1.25}))
        await ws.send(json.dumps({"type": "input.text", "text": "Only the speed should change."}))
        await ws.send(json.dumps({"type": "input.done"}))
        events = []
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, str):
                events.append(json.loads(message))
                if events[-1]["type"] == "session.done":
                    break
    errors = [e for e in events if e["type"] == "error"]
    start = next((e for e in events if e["type"] == "audio.start"), None)
    if errors or start is None:
        print(f"unexpected: {events}")
        return 2
    if start["format"] != "pcm":
        print(f"FAULT: after session.config {{speed: 1.25}} the sentence came as format {start['format']!r}; "
              "expected 'pcm' (set by the first session.config and not named by the second)")
        return 1
    print("ok: format pcm kept")
    return 0


sys.exit(asyncio.run(main()))
