"""The 400 `audio_too_long` of a chat request whose input_audio parts together pass `--max-audio-seconds`
states a wrong limit and points at the wrong part.

Two parts of 301 s each (602 s in all, limit 600 s). Expected: the message names the limit
("longer than 600 s in all") and `param` names the part that passed it
(`messages[0].content[1].input_audio`, the path notation the server uses elsewhere, e.g.
`messages[0].content[1].text` for invalid_unicode). Observed: "the request's input audio is longer than
299 s in all (limit --max-audio-seconds)" (the budget left for the second part, not the limit) with
`param` `messages[0].content.input_audio` (no part index). frontend/chat_protocol.py `_audio_part`.

Assumes the default --max-audio-seconds 600. Exit 1 while the message or param is wrong, 0 when right.
Env: BASE_URL (default http://127.0.0.1:21000).
"""
import base64
import io
import os
import sys
import wave

import httpx

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
LIMIT_S = 600


def silent_wav(seconds: int, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(bytes(seconds * rate * 2))
    return out.getvalue()


def main() -> int:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(silent_wav(301)).decode(), "format": "wav"}}
    r = httpx.post(BASE + "/v1/chat/completions", timeout=120, json={
        "model": "voice", "max_tokens": 2, "modalities": ["text"],
        "messages": [{"role": "user", "content": [part, part]}]})
    error = r.json().get("error", {})
    print("observed:", r.status_code, error.get("code"), repr(error.get("message")), "param:", error.get("param"))
    ok = (r.status_code == 400 and error.get("code") == "audio_too_long" and f"{LIMIT_S} s" in error.get("message", "")
          and error.get("param") == "messages[0].content[1].input_audio")
    print(f"expected: 400 audio_too_long naming the {LIMIT_S} s limit, param messages[0].content[1].input_audio")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
