"""Fault (outside test 16): a prompt that fits the static context is a 400 naming `max_tokens`, which was not sent.

Server S or T (see static_talker_slots_full_is_500.py / static_talker_max_len_drops_speech.py: thinker `max_len: 128`,
`max_tokens: 64`, the deploy file's request default).
What is wrong: a chat whose prompt is 109 tokens and that sends NO `max_tokens` / `max_completion_tokens` is a
400 `context_length_exceeded`, param "max_tokens": "prompt (109 tokens) plus max_tokens (64) exceeds the context
length 128". The client never sent max_tokens; the server's default is taken as if it had. A deploy file may set
`stages.thinker.max_tokens` larger than `max_len` (the loader does not compare them), and then every chat without
max_tokens is refused. OpenAI and vLLM treat an absent max_tokens as "up to the context" (vLLM: max_model_len -
prompt tokens).
What is right: without max_tokens the answer is cut at the room left (min(default, max_len - prompt)), a 200 with
finish_reason "length" at worst; a 400 naming max_tokens only when the client sent it.
Exits 1 while the 400 comes, 0 once fixed. Env BASE_URL (default http://127.0.0.1:43000).
"""
import os
import sys

import httpx

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:43000")
try:
    httpx.get(f"{BASE}/health", timeout=5).raise_for_status()
except httpx.HTTPError as exc:
    print(f"no server at {BASE} ({exc})")
    sys.exit(2)
content = " ".join(["word"] * 50)
count = httpx.post(f"{BASE}/tokenize", json={"model": "qwen3_omni", "messages": [{"role": "user", "content": content}]},
                   timeout=60).json()
print(f"prompt tokens {count.get('count')}, context {count.get('max_model_len')}")
reply = httpx.post(f"{BASE}/v1/chat/completions", timeout=120, json={
    "model": "qwen3_omni", "messages": [{"role": "user", "content": content}], "modalities": ["text"],
    "temperature": 0})
body = reply.json()
if reply.status_code == 200:
    print("200", body["choices"][0]["finish_reason"], body["usage"])
else:
    print(reply.status_code, body["error"])
ok = reply.status_code == 200
print("fixed" if ok else "FAULT present: refused for a max_tokens the client did not send")
sys.exit(0 if ok else 1)
