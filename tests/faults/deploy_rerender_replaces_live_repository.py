"""Fault (outside test 16): rendering a deploy file replaces the model repository a running server loads from.

What is wrong: `./scripts/serve --deploy F` renders into `var/deploy/<stem of F>/` (removed first, `deploy.render`)
and serves from there for its whole life; Triton reloads models from it on stage recovery and on wake. Any later
render of a file with the same stem -- `python -m omni_frontend.deploy F` ("render only" in docs/gpu.md), or a second
`./scripts/serve --deploy F` that then stops at "port ... is already in use" (it renders BEFORE checking ports) --
replaces the live server's models. Seen: server on deploy/qwen3_omni_cpu.yaml, then a failed second serve of
/tmp/x/qwen3_omni_cpu.yaml (`checkpoint: /nonexistent/...`); killing the talker's stub made recovery reload it from
the new config: "reload failed: ... checkpoint directory /nonexistent/... does not exist", every audio chat 503 for
good. The same happens on sleep/wake (this script), with edits of the same file, and mid-rmtree for an identical file.
What is right: a render never touches a repository a running server uses (a per-run folder, or a refusal naming
the folder), and a launcher that fails its checks renders nothing; the server keeps serving what it started with.
Exits 1 while the fault is present, 0 once fixed. Starts its own server on PORT (default 43000) .. PORT+3 (stopped
at the end): run it with no other server on those ports. Takes ~1-2 minutes.
CONTROL=1 runs the same steps with the second serve naming the live file itself (identical content): exits 0.
"""
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[2]
port = int(os.environ.get("PORT", "43000"))
base = f"http://127.0.0.1:{port}"
ports = ["--port", str(port), "--triton-grpc-port", str(port + 1), "--triton-metrics-port", str(port + 3)]
tmp = pathlib.Path(tempfile.mkdtemp(prefix="brk16_live_"))
(tmp / "a").mkdir()
(tmp / "b").mkdir()
live, other = tmp / "a/brk16_live.yaml", tmp / "b/brk16_live.yaml"
live.write_text("pipeline: qwen3_omni\ncheckpoint: qwen3_omni_tiny\n")
other.write_text("pipeline: qwen3_omni\ncheckpoint: /nonexistent/brk16/other\n")
server = subprocess.Popen([str(ROOT / "scripts/serve"), "--deploy", str(live), *ports, "--log-dir", str(tmp / "log")],
                          cwd=ROOT, stdout=open(tmp / "serve.log", "w"), stderr=subprocess.STDOUT)
status = 1
try:
    for _ in range(150):
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            print(f"server did not start (log {tmp / 'serve.log'})")
            sys.exit(2)
        time.sleep(1)
    chat = {"model": "qwen3_omni", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
            "temperature": 0, "modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}
    print("before:", httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=120).status_code)
    if os.environ.get("CONTROL"):   # control run: no second render; sleep/wake must then serve again
        other = live
    second = subprocess.run([str(ROOT / "scripts/serve"), "--deploy", str(other), *ports], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    print("second serve:", second.returncode, second.stderr.strip().splitlines()[-1][:120])
    admin = f"{base}/v1/admin/pipelines/qwen3_omni"
    print("sleep:", httpx.post(f"{admin}/sleep", timeout=120).status_code,
          "wake:", httpx.post(f"{admin}/wake", timeout=300).status_code)
    reply = None
    for _ in range(30):
        reply = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=120)
        if reply.status_code == 200:
            break
        time.sleep(2)
    print("after:", reply.status_code, reply.text[:200] if reply.status_code != 200 else "")
    status = 0 if reply.status_code == 200 else 1
    print("fixed" if status == 0 else "FAULT present: the failed second serve replaced the live server's models")
finally:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
sys.exit(status)
