"""Ctrl-C (SIGINT) to `./scripts/serve` while a Qwen3-Omni chat with speech is streaming: the stream is cut at
once (fine), but tritonserver then waits its whole 30 s exit timeout for one `qwen3_omni_talker` request that never
ends ("Model 'qwen3_omni_talker' (version 1) has 1 in-flight inferences" every second, then "failed to stop server:
Internal - Exit timeout expired. Exiting immediately."), and every stub is killed unfinalized ("Non-graceful
termination detected", 8 /dev/shm regions of killed stubs left for the launcher to remove). Measured: 38.1 s from
SIGINT to the launcher's exit with voice,tts,asr,qwen3_omni (8.3 s idle, 20.3 s right after a client had left a
qwen3_omni stream, same server); with qwen3_omni alone see the numbers this script prints.

Why (as far as seen from outside): the frontend's streams end and tritonserver gets SIGTERM within ~60 ms; the
orchestrator's ABORT of the talker sequence is then refused by the stopping server, so the talker's open
sequence request never finishes inside Triton.
Expected (docs/reliability.md "A clean stop leaves nothing behind" / "Stubs also exit without crashing", and the
stated aim there that a stop should not "sit out tritonserver's 30 s exit timeout" and kill "the healthy ones
unfinalized"): a stop with requests in flight ends them (cancel, drain or unload first) and every stub finalizes;
the launcher exits well before the exit timeout, as it does idle.
This script starts its own server (`--pipelines qwen3_omni`, ports 23200-23203 unless OMNI_FAULT_PORT is set),
streams one qwen3_omni chat with audio, presses Ctrl-C after the 5th audio chunk and reads the server log.
Exit 1 while the stop sits out the exit timeout (or takes over 30 s), 0 when it does not.
"""
import json, os, signal, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("OMNI_FAULT_PORT", "23200"))
BASE = f"http://127.0.0.1:{PORT}"
logs = Path(tempfile.mkdtemp(prefix="omni_fault_stop_"))
server = subprocess.Popen([str(ROOT / "scripts/serve"), "--pipelines", "qwen3_omni", "--port", str(PORT),
                           "--triton-grpc-port", str(PORT + 1), "--triton-metrics-port", str(PORT + 3),
                           "--log-dir", str(logs), "--no-prepare"], cwd=ROOT, stdout=open(logs / "serve.out", "w"),
                          stderr=subprocess.STDOUT)
try:
    deadline = time.monotonic() + 600
    while True:
        try:
            if urllib.request.urlopen(BASE + "/health", timeout=5).status == 200:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            print(open(logs / "serve.out").read()[-3000:])
            sys.exit("the server did not come up")
        time.sleep(1)
    body = json.dumps({"model": "qwen3_omni", "stream": True, "max_tokens": 2000, "audio": {"voice": "chelsie",
                       "format": "pcm16"}, "messages": [{"role": "user", "content": "Tell me a long story."}]}).encode()
    req = urllib.request.Request(BASE + "/v1/chat/completions", body, {"content-type": "application/json"})
    chunks = 0
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if b'"audio"' in line:
                chunks += 1
            if chunks == 5:
                break
        started = time.monotonic()
        server.send_signal(signal.SIGINT)
        try:
            for _ in r:
                pass
        except Exception:  # noqa: BLE001 - the stream is cut: expected
            pass
    try:
        server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
    took = time.monotonic() - started
finally:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)
log = (logs / "tritonserver.log").read_text(errors="replace")
inflight = sorted({line.split("Model ")[1].split(" has")[0] for line in log.splitlines() if "in-flight inferences\"" in line
                   and "Model '" in line})
expired = "Exit timeout expired" in log
nongraceful = log.count("Non-graceful termination detected")
print(f"SIGINT during a qwen3_omni speech stream: launcher exited after {took:.1f} s; models with in-flight inferences "
      f"at the stop: {inflight}; exit timeout expired: {expired}; stubs terminated non-gracefully: {nongraceful} "
      f"(logs in {logs})")
if expired or took > 30:
    print("FAULT: the stop sat out tritonserver's exit timeout waiting for a request that never ends, and killed the "
          "stubs unfinalized (expected: in-flight requests end and the server stops as fast as when idle)")
    sys.exit(1)
print("ok: the stop did not wait for the exit timeout")
sys.exit(0)
