"""Server A. /v1/audio/transcriptions silently ignores multipart fields it does not read, while chat, speech and
images now refuse unread fields with 400 unsupported_parameter (commit 57e4823) — a typo such as
`timestamp_granularity=word` (singular, no []) gives a 200 without the words the client asked for.

Steps: POST multipart file=<wav>, model=asr, response_format=verbose_json, timestamp_granularity=word.
Expected: 400 `unsupported_parameter` naming timestamp_granularity (the server's own rule for unread fields,
README "Operations": fields that would change the answer's contract but are not supported are rejected naming the
field; docs/pipelines.md for the other routes).
Actual: 200, no `words`, nothing tells the client its field was dropped.
"""
import io, os, sys, wave
import httpx

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
buf = io.BytesIO()
with wave.open(buf, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(b"\0\0" * 16000)
r = httpx.post(B + "/v1/audio/transcriptions", files={"file": ("s.wav", buf.getvalue(), "audio/wav")},
               data={"model": "asr", "response_format": "verbose_json", "timestamp_granularity": "word"}, timeout=120)
print(r.status_code, r.text[:300])
if r.status_code == 400 and "timestamp_granularity" in r.text:
    sys.exit(0)
print("FAULT: unknown form field timestamp_granularity silently ignored"); sys.exit(1)
