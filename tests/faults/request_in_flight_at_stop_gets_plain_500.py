"""Ctrl-C (SIGINT) to `./scripts/serve` while a non-streamed request is in flight: after uvicorn's 5 s graceful
shutdown the request's task is cancelled and the client gets `500` with the plain-text body `Internal Server
Error` (content-type text/plain, no `x-request-id`), the frontend logs "Exception in ASGI application" with a
CancelledError traceback ("Task cancelled, timeout graceful shutdown exceeded"), and the access log (and
`omni_frontend_requests_total`) record the request as **499**, "client closed request", though the client was
still waiting. Seen with a 512x512 200-step image (the same path serves every non-streamed route: chat, speech,
transcriptions, edits). Streamed responses in flight at the stop (chat, SSE speech, streamed transcription,
streamed images) are cut at once, without an error event or `[DONE]` (the client sees "incomplete chunked read"),
and are logged as 200 with uvicorn's "ASGI callable returned without completing response"; a realtime socket gets
a clean close 1012.

Expected: README "Errors always use OpenAI's envelope `{"error": {"message", "type", "param", "code"}}`";
docs/reliability.md "Server errors and client aborts": a server-side failure is a 500 *envelope* and a 499 only
means "A client that leaves before its response is complete". A request the server gives up on because it is
stopping should get an envelope (naturally 503 `service_unavailable` with Retry-After, which the OpenAI SDK
retries), no traceback, and be counted with the status it got.
This script starts its own server (`--pipelines qwen_image`, ports 23210-23213 unless OMNI_FAULT_PORT is set),
sends one long image request, presses Ctrl-C 2 s later and reads the answer and the access log.
Exit 1 while the answer is not an error envelope or the log counts it as 499 / prints a traceback, 0 when fixed.
"""
import json, os, signal, subprocess, sys, tempfile, threading, time, urllib.error, urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("OMNI_FAULT_PORT", "23210"))
BASE = f"http://127.0.0.1:{PORT}"
logs = Path(tempfile.mkdtemp(prefix="omni_fault_stop500_"))
out = open(logs / "serve.out", "w")
server = subprocess.Popen([str(ROOT / "scripts/serve"), "--pipelines", "qwen_image", "--port", str(PORT),
                           "--triton-grpc-port", str(PORT + 1), "--triton-metrics-port", str(PORT + 3),
                           "--log-dir", str(logs), "--no-prepare"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
answer = {}


def generate():
    body = json.dumps({"model": "qwen_image", "prompt": "a lighthouse", "size": "512x512",
                       "num_inference_steps": 200}).encode()
    req = urllib.request.Request(BASE + "/v1/images/generations", body, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            answer.update(status=r.status, type=r.headers.get("content-type"), body=r.read()[:300])
    except urllib.error.HTTPError as e:
        answer.update(status=e.code, type=e.headers.get("content-type"), body=e.read()[:300])
    except OSError as e:
        answer.update(status=None, type=None, body=repr(e).encode())


try:
    deadline = time.monotonic() + 600
    while True:
        try:
            if urllib.request.urlopen(BASE + "/health", timeout=5).status == 200:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit("the server did not come up: " + (logs / "serve.out").read_text()[-2000:])
        time.sleep(1)
    client = threading.Thread(target=generate)
    client.start()
    time.sleep(2)
    server.send_signal(signal.SIGINT)
    client.join(120)
    server.wait(timeout=120)
finally:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
log = (logs / "serve.out").read_text(errors="replace")
access = [line for line in log.splitlines() if "POST /v1/images/generations ->" in line]
print(f"answer to the request in flight at the stop: {answer.get('status')} {answer.get('type')} {answer.get('body')!r}")
print(f"access log: {access[-1] if access else None}")
print(f"traceback in the frontend log: {'Traceback' in log} (logs in {logs})")
try:
    envelope = isinstance(json.loads(answer.get("body") or b"null").get("error"), dict)
except (ValueError, AttributeError):
    envelope = False
if not envelope or (access and "-> 499" in access[-1]) or "Traceback" in log:
    print("FAULT: a request cut by the stop gets a plain-text 500 and is logged as a client abort (499) with a "
          "traceback (expected: an OpenAI error envelope, e.g. 503, logged with that status)")
    sys.exit(1)
print("ok")
sys.exit(0)
