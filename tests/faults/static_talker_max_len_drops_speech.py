"""Fault (outside test 16): a prompt past the static talker's `max_len` gets a 200 with 10 ms of audio, no word why.

Server T (from the checkout's root; the script writes the deploy file):
  ./scripts/serve --deploy /tmp/brk16_stages_static.yaml --port 43000 --triton-grpc-port 43001 --triton-metrics-port 43003
(stage layout, static engines on CPU, tiny checkpoint; thinker max_len 128, talker max_len 40.)

What is wrong: the frontend checks the prompt against the THINKER's context only (`context_length_exceeded` names
`messages` / `max_tokens`); the talker's prompt (the thinker prompt's positions) beyond the talker's static
`max_len` is ended at once by `Talker` ("prompt beyond max_len", `TalkerOutput(..., "length")`), so a chat with
`modalities: ["text", "audio"]` and a 49-token prompt is a 200, finish_reason "length", `audio_tokens: 0` and a WAV of
480 bytes of PCM (10 ms): the speech the client asked for is dropped silently (13- and 29-token prompts get speech).
A deploy file may set the talker's max_len below what the thinker accepts; the loader does not compare them.
What is right: such a request is a 400 `context_length_exceeded` naming the field (as the thinker's bound is), or
the deploy loader refuses a talker max_len that cannot hold every prompt the thinker takes (one line naming
`stages.talker.max_len`); never a 200 with the audio silently missing.
Exits 1 while a 200 comes with no speech, 0 once fixed. Env BASE_URL (default http://127.0.0.1:43000).
"""
import os
import sys

import httpx

YAML = """pipeline: qwen3_omni
layout: stages
checkpoint: qwen3_omni_tiny
stages:
  thinker: {device: cpu, engine: static, max_running: 2, max_len: 128, max_tokens: 64}
  talker: {device: cpu, engine: static, max_running: 2, max_len: 40, max_frames: 200}
"""
if not os.path.exists("/tmp/brk16_stages_static.yaml"):
    with open("/tmp/brk16_stages_static.yaml", "w") as f:
        f.write(YAML)
BASE = os.environ.get("BASE_URL", "http://127.0.0.1:43000")
try:
    httpx.get(f"{BASE}/health", timeout=5).raise_for_status()
except httpx.HTTPError as exc:
    print(f"server T is not up at {BASE} ({exc}); start it as the docstring says")
    sys.exit(2)
reply = httpx.post(f"{BASE}/v1/chat/completions", timeout=120, json={
    "model": "qwen3_omni", "messages": [{"role": "user", "content": " ".join(["word"] * 20)}], "max_tokens": 10,
    "temperature": 0, "modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}})
body = reply.json()
if reply.status_code != 200:
    print(reply.status_code, body.get("error"))
    ok = reply.status_code == 400
else:
    usage = body["usage"]
    audio = (body["choices"][0]["message"].get("audio") or {}).get("data", "")
    print(f"200 usage={usage} audio base64 chars={len(audio)}")
    ok = usage["completion_tokens_details"]["audio_tokens"] > 0
print("fixed" if ok else "FAULT present: the speech was dropped without a word")
sys.exit(0 if ok else 1)
