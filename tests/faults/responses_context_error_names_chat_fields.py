"""Fault (outside test 16, minor): /v1/responses' context-length errors speak of chat fields the request lacks.

Server S (static_talker_slots_full_is_500.py; any qwen3_omni server shows it, the tiny context 128 just makes it easy).
What is wrong: the param is right (`max_output_tokens` / `input`), but the message names `messages` and `max_tokens`,
which a Responses request does not have (and sending them is a 400 unsupported_parameter):
  {"input": "hi", "max_output_tokens": 1000} -> "the messages hold 2 characters: at least 1 tokens, which with
  max_tokens (1000) exceeds the context length 128" (param max_output_tokens).
What is right: the message names the Responses fields (`input`, `max_output_tokens`), as the param does.
Exits 1 while a Responses error message names `max_tokens` or `messages`, 0 once fixed. Env BASE_URL (default
http://127.0.0.1:43000).
"""
import os
import re
import sys

import httpx

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:43000")
try:
    httpx.get(f"{BASE}/health", timeout=5).raise_for_status()
except httpx.HTTPError as exc:
    print(f"no server at {BASE} ({exc})")
    sys.exit(2)
context = httpx.post(f"{BASE}/tokenize", json={"model": "qwen3_omni", "prompt": "hi"}, timeout=60).json()["max_model_len"]
bad = 0
for body in ({"input": "hi", "max_output_tokens": context + 10},
             {"input": " ".join(["word"] * context), "max_output_tokens": 16}):
    reply = httpx.post(f"{BASE}/v1/responses", json={"model": "qwen3_omni", **body}, timeout=120)
    error = reply.json().get("error") or {}
    wrong = re.findall(r"\b(messages|max_tokens)\b", error.get("message", ""))
    print(reply.status_code, error.get("param"), repr(error.get("message", ""))[:160], "names:", wrong)
    bad += bool(wrong)
print("FAULT present" if bad else "fixed")
sys.exit(1 if bad else 0)
