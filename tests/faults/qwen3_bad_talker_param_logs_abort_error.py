"""Every qwen3_omni chat refused for a bad `talker_*` extension value (a client error, answered 400) makes
the orchestrator log a server ERROR line: it ABORTs a code2wav sequence that was never started.

Expected: a 400 for the client and nothing at error level in the server log (the sequence was never
opened, so there is nothing to abort; docs/reliability.md B28: a sequence is marked open before its START
request leaves). Observed in the tritonserver log (var/log/tritonserver.log), one per refused request:
  E... omni_model.py:207] "qwen3_omni: aborting the qwen3_omni_code2wav sequence failed: ... inference
  request for sequence N to model 'qwen3_omni_code2wav' must specify the START flag on the first request
  of the sequence"
Any client can fill the error log (and log-based alerting) with these at the rate of cheap 400s.

Exit 1 while the 400 adds such a line, 0 otherwise. Env: BASE_URL (default http://127.0.0.1:21000),
TRITON_LOG (default: var/log/tritonserver.log under the server's checkout, /tmp/brk here).
"""
import os
import sys
import time

import httpx

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:21000").rstrip("/")
LOG = os.environ.get("TRITON_LOG", "/tmp/brk/var/log/tritonserver.log")
NEEDLE = "aborting the qwen3_omni_code2wav sequence failed"


def count() -> int:
    with open(LOG, errors="replace") as f:
        return sum(NEEDLE in line for line in f)


def main() -> int:
    before = count()
    statuses = []
    for bad in ({"talker_top_p": 0}, {"talker_repetition_penalty": 0}, {"talker_temperature": -1}):
        r = httpx.post(BASE + "/v1/chat/completions", timeout=120, json={
            "model": "qwen3_omni", "max_tokens": 4, "audio": {"voice": "chelsie", "format": "wav"},
            "messages": [{"role": "user", "content": "hi"}], **bad})
        statuses.append(r.status_code)
    time.sleep(1.5)
    added = count() - before
    print(f"3 requests with a bad talker_* value -> {statuses}; error lines added to {LOG}: {added}")
    print("expected: 400s and no 'aborting ... sequence failed' error lines")
    return 1 if added else 0


if __name__ == "__main__":
    sys.exit(main())
