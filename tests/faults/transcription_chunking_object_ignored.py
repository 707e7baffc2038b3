"""Server A. /v1/audio/transcriptions accepts the openai SDK's object form of `chunking_strategy`
({"type": "server_vad", ...}, sent by the SDK as the multipart field `chunking_strategy[type]`) and drops it.

Steps: client.audio.transcriptions.create(model="asr", file=<wav>, chunking_strategy={"type": "server_vad",
"silence_duration_ms": 200}).
Expected: the route refuses any chunking_strategy other than "auto" (its own rule: 400 unsupported_parameter
naming chunking_strategy, as it does for the string "server_vad"; docs/pipelines.md, OpenAI's
TranscriptionCreateParams.chunking_strategy = "auto" | {"type": "server_vad", ...}).
Actual: 200, the object form is silently ignored (only the plain string field is checked).
"""
import io, os, sys, wave
import openai

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
c = openai.OpenAI(base_url=B + "/v1", api_key="x", max_retries=0, timeout=120)
buf = io.BytesIO()
with wave.open(buf, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(b"\0\0" * 16000)
try:
    c.audio.transcriptions.create(model="asr", file=("s.wav", buf.getvalue(), "audio/wav"),
                                  chunking_strategy={"type": "server_vad", "silence_duration_ms": 200})
except openai.BadRequestError as exc:
    print("fixed: 400", exc.body); sys.exit(0)
print("FAULT: chunking_strategy {'type': 'server_vad'} accepted and ignored (200)"); sys.exit(1)
