"""Server A. `timestamp_granularities[]=word` with response_format json (the SDK's default) is accepted and dropped:
the answer is {"text", "usage"} without words and without any error, and the server still computes word timings.

Steps: client.audio.transcriptions.create(model="asr", file=<wav>, timestamp_granularities=["word"]) (no response_format).
Expected: 400 naming timestamp_granularities (OpenAI's API reference: "response_format must be set verbose_json to use
timestamp granularities"; /work/shared/notes/openai_wire.md: words[] only with verbose_json), or words returned.
Actual: 200 {"text", "usage"}, the granularity is silently ignored.
"""
import io, os, sys, wave
import openai

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
c = openai.OpenAI(base_url=B + "/v1", api_key="x", max_retries=0, timeout=120)
buf = io.BytesIO()
with wave.open(buf, "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(b"\0\0" * 16000)
try:
    r = c.audio.transcriptions.create(model="asr", file=("s.wav", buf.getvalue(), "audio/wav"),
                                      timestamp_granularities=["word"])
except openai.BadRequestError as exc:
    print("fixed: 400", exc.body); sys.exit(0)
if getattr(r, "words", None) is not None or (r.model_extra or {}).get("words") is not None:
    print("fixed: words returned"); sys.exit(0)
print("FAULT: timestamp_granularities=['word'] with json accepted, no words:", r); sys.exit(1)
