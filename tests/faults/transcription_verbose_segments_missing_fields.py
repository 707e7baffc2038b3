"""`response_format=verbose_json` transcription segments lack the fields OpenAI's API always returns.

Expected: each `segments[]` entry has OpenAI's TranscriptionSegment fields (the SDK types declare them
non-optional): id, seek, start, end, text, tokens (list of ints), temperature, avg_logprob,
compression_ratio, no_speech_prob. faster-whisper, which the asr stage runs, computes all of them.
Observed: segments are only {"id", "start", "end", "text"}; the openai SDK then gives None for
`segment.avg_logprob`, `no_speech_prob`, ... so the usual client code (e.g. dropping segments with
`seg.no_speech_prob > 0.6`) raises TypeError.

Exit 1 while fields are missing, 0 when present. Env: BASE_URL (default http://127.0.0.1:21000).
"""
import os
import sys

import httpx
import openai

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
FIELDS = ("id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio",
          "no_speech_prob")


def main() -> int:
    speech = httpx.post(BASE + "/v1/audio/speech", timeout=120, json={
        "model": "tts", "voice": "alloy", "input": "Hello from Triton, testing one two three.",
        "response_format": "wav"})
    speech.raise_for_status()
    client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused")
    result = client.audio.transcriptions.create(model="whisper-1", file=("hello.wav", speech.content),
                                                response_format="verbose_json")
    raw = result.model_dump()
    print("text:", result.text)
    missing = set()
    for seg in raw.get("segments") or []:
        missing |= {f for f in FIELDS if seg.get(f) is None}
    if not raw.get("segments"):
        missing.add("segments")
    print("first segment:", (raw.get("segments") or [None])[0])
    print("missing or null:", sorted(missing) or "none")
    try:
        kept = [s.text for s in result.segments if s.no_speech_prob < 0.6]
        print("typical client filter ok:", kept)
    except TypeError as exc:
        print("typical client filter fails:", exc)
    print("expected: every OpenAI segment field present (", ", ".join(FIELDS), ")")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
