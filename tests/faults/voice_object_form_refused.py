"""Server A. The voice object form {"id": ...} of OpenAI's current wire (openai 3.57 SpeechCreateParams.voice and
ChatCompletionAudioParam.voice: a name or {"id": "voice_1234"}) is refused by /v1/audio/speech and chat's audio.voice
with a type error ("voice: Input should be a valid string", code invalid_value), although the realtime session takes
the same object (frontend/realtime/config.py voice_name: a name or {"id": ...}) and resolves it.

Steps: POST /v1/audio/speech {"model": "tts", "voice": {"id": "alloy"}, "input": "hi", "response_format": "pcm"};
POST /v1/chat/completions with audio {"voice": {"id": "alloy"}, "format": "wav"}.
Expected: the object's id is resolved as in realtime (200 with audio), or at least the same answer as for an unknown
name (400 naming voice with the list of voices), not a schema type error.
Actual: 400 invalid_value "voice: Input should be a valid string" on both routes.
"""
import os, sys
import httpx

B = os.environ.get("BASE_URL", "http://127.0.0.1:21000")
s = httpx.post(B + "/v1/audio/speech", json={"model": "tts", "voice": {"id": "alloy"}, "input": "hi",
                                             "response_format": "pcm"}, timeout=120)
c = httpx.post(B + "/v1/chat/completions", json={"model": "voice", "modalities": ["text", "audio"],
                                                 "audio": {"voice": {"id": "alloy"}, "format": "wav"},
                                                 "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
               timeout=120)
print("speech", s.status_code, s.text[:160] if s.status_code != 200 else len(s.content))
print("chat", c.status_code, c.text[:160])
if "valid string" in s.text or "valid string" in c.text:
    print("FAULT: voice object {'id': ...} refused as a type error"); sys.exit(1)
sys.exit(0)
