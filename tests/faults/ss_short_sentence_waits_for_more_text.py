"""Speech stream (split_granularity "sentence", the default): a complete sentence of fewer than 4 words is not
spoken when it is complete. "Sure thing! " sent alone is held until more text (then it is spoken merged with the next
sentence) or input.done: an LLM's "Sure thing!" followed by a slow answer stays silent while the client waits.

Wrong: frontend/routes/speech_stream.py makes `SentenceChunker(clauses=False)`, whose `min_words` (4) makes a
sentence end count only once the chunk holds 4 words (the in-process baseline's rule, not "a sentence").
Expected (module docstring: "sentence" (default: a sentence is spoken as soon as it is complete); docs/pipelines.md:
"each sentence is spoken as soon as it is complete"): audio.start for "Sure thing!" comes without more text and
without input.done (if a minimum length is meant, the docs must say so).
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
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "pcm"}))
        await ws.send(json.dumps({"type": "input.text", "text": "Sure thing! "}))
        try:
            while True:
                message = await asyncio.wait_for(ws.recv(), 15)
                if isinstance(message, str) and json.loads(message)["type"] == "audio.start":
                    print(f"ok: spoken without more text: {json.loads(message)['sentence_text']!r}")
                    return 0
        except asyncio.TimeoutError:
            pass
        await ws.send(json.dumps({"type": "input.text", "text": "Here is the answer you asked for. "}))
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, str) and json.loads(message)["type"] == "audio.start":
                text = json.loads(message)["sentence_text"]
                break
    print("FAULT: the complete sentence 'Sure thing!' got no audio.start in 15 s; it was spoken only with the next "
          f"sentence: sentence_text {text!r}. Expected its own audio.start as soon as it was complete")
    return 1


sys.exit(asyncio.run(main()))
