"""Speech stream: with response_format flac, a sentence whose speech has no samples gets a binary frame of 0 bytes
(`audio.done` total_bytes 0, error false): not a FLAC file (soundfile cannot open it), where wav gets a valid
44-byte WAV of 0 samples.

Trigger: "[](abc)" (letters, but `markup.speakable` makes it "": the pipeline speaks nothing).
Wrong: frontend/routes/speech_stream.py `_speak` sends `audio_codec.encode(<0 samples>, rate, "flac")` as is; that
is b"" (soundfile writes nothing for an empty FLAC). POST /v1/audio/speech answers the same input 200 with an empty
flac body, the same root.
Expected (module docstring: "else one file in response_format"): the binary frame is a FLAC file that decodes (to
0 samples), or the sentence is an `error` event with audio.done error true; never an "ok" sentence with no file.
Exit 1 while the fault is present, 0 when fixed.
"""
import asyncio, io, json, os, sys

import soundfile as sf
import websockets

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:26000").rstrip("/")
WS = "ws" + BASE[4:] + "/v1/audio/speech/stream"
KEY = os.environ.get("OPENAI_API_KEY")


async def main():
    headers = {"authorization": f"Bearer {KEY}"} if KEY else {}
    async with websockets.connect(WS, max_size=None, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "alloy", "response_format": "flac"}))
        await ws.send(json.dumps({"type": "input.text", "text": "[](abc)"}))
        await ws.send(json.dumps({"type": "input.done"}))
        frames, events = [], []
        while True:
            message = await asyncio.wait_for(ws.recv(), 40)
            if isinstance(message, bytes):
                frames.append(message)
                continue
            events.append(json.loads(message))
            if events[-1]["type"] == "session.done":
                break
    done = next(e for e in events if e["type"] == "audio.done")
    if done["error"]:
        print(f"ok: the silent sentence is an error: {[e for e in events if e['type'] == 'error']}")
        return 0
    problems = []
    for frame in frames:
        try:
            data, rate = sf.read(io.BytesIO(frame))
        except Exception as exc:  # noqa: BLE001
            problems.append(f"frame of {len(frame)} bytes does not decode as FLAC: {exc}")
    if len(frames) != 1:
        problems.append(f"{len(frames)} binary frames for the sentence (one file expected)")
    if problems:
        print("FAULT: " + "; ".join(problems) + f" (audio.done {done})")
        print("expected: one FLAC file (0 samples) or an error event with audio.done error true")
        return 1
    print(f"ok: a FLAC file of {len(frames[0])} bytes")
    return 0


sys.exit(asyncio.run(main()))
