"""Own server (started by this script: `./scripts/serve --pipelines qwen3_omni --no-frontend` on ports
STOP_PORT..STOP_PORT+3, default 25100). After a few ordinary `qwen3_omni` chats with speech sent straight to Triton
(all answered in full, every omni_inflight_requests gauge 0), Ctrl-C of the launcher does not unload the models:
Triton still counts `qwen3_omni_talker` inferences in flight, waits its whole 30 s exit timeout, then exits at once
and every stub is killed unfinalized.

docs/architecture.md "Launcher": "tritonserver gets --exit-timeout-secs=30 (`EXIT_TIMEOUT_S`) to unload its models
(5 s was too short ...; on 2 busy cores they took 17.3 s)"; docs/reliability.md "A clean stop leaves nothing behind" /
"Stubs also exit without crashing": every model's `finalize` runs at a stop (metrics closed, parked BLS iterators
released). Seen on server A at two Ctrl-C stops after qwen3_omni chats (the second after only 12 chats):
  server.cc:325] "Model 'qwen3_omni_talker' (version 1) has 2 in-flight inferences"   (all 30 s)
  main.cc:535] "failed to stop server: Internal - Exit timeout expired. Exiting immediately."
  pb_stub.cc:2145] Non-graceful termination detected.
No model was unloaded (no finalize ran). This script (8 chats, a fresh qwen3_omni-only server) saw the same in 2 of 2 runs:
"has 2 in-flight inferences", 0 models unloaded, stop 31-36 s. The same server stopped cleanly in 22 s when qwen3_omni had been slept
and woken after the chats (the sleep unloads the orchestrator first): the talker requests that stay open are
most likely the finished BLS streams the orchestrator parks (`serving.retire`), let go only after a LATER request's
`is_cancelled()`, which never comes once traffic stops.
Right: with nothing in flight, tritonserver unloads every model within the exit timeout ("successfully unloaded"
for each, no "Exit timeout expired").

Exits 1 while the stop sits out the exit timeout, 0 when every model unloads. Takes ~3-4 min on 2 loaded cores.
"""
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

ROOT = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("STOP_PORT", "25100"))
GRPC = f"127.0.0.1:{PORT + 1}"


def chat(i: int):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(GRPC)
    request = grpcclient.InferInput("REQUEST", [1], "BYTES")
    body = {"messages": [{"role": "user", "content": f"Tell me a story {i}."}], "max_tokens": 60}
    request.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=np.object_))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("qwen3_omni", [request], enable_empty_final_response=True)
    audio, errors = 0, []
    try:
        while True:
            result, error = answers.get(timeout=120)
            if error is not None:
                errors.append(str(error))
                break
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            if json.loads(result.as_numpy("EVENT").reshape(-1)[0])["type"] == "audio.delta":
                audio += 1
    finally:
        client.stop_stream()
        client.close()
    return audio, errors


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="omni-stop-"))
    server = subprocess.Popen(
        [str(ROOT / "scripts" / "serve"), "--pipelines", "qwen3_omni", "--no-frontend", "--port", str(PORT),
         "--triton-grpc-port", str(PORT + 1), "--triton-metrics-port", str(PORT + 3), "--log-dir", str(logs)],
        cwd=ROOT, stdout=open(logs / "serve.out", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = grpcclient.InferenceServerClient(GRPC)
        deadline = time.time() + 420
        while time.time() < deadline:
            try:
                if client.is_model_ready("qwen3_omni"):
                    break
            except Exception:  # noqa: BLE001
                pass
            if server.poll() is not None:
                print("the server exited:", (logs / "serve.out").read_text()[-2000:])
                return 2
            time.sleep(2)
        else:
            print("the server did not get ready: inconclusive")
            return 2
        for i in range(8):
            audio, errors = chat(i)
            print(f"chat {i}: {audio} audio deltas, errors {errors[:1]}")
            if errors or not audio:
                print("a chat failed: inconclusive")
                return 2
        time.sleep(3)
    finally:
        started = time.time()
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=90)
        except subprocess.TimeoutExpired:
            server.kill()
        stopped = time.time() - started
    log = (logs / "tritonserver.log").read_text(errors="replace")
    inflight = sorted({line.split("]", 1)[1].strip() for line in log.splitlines() if "in-flight inferences\"" in line
                       and "has" in line})
    unloaded = log.count("successfully unloaded")
    timed_out = "Exit timeout expired" in log
    print(f"stop took {stopped:.1f} s; models unloaded: {unloaded}; exit timeout expired: {timed_out}; "
          f"in-flight lines: {inflight[:2]}; logs: {logs}")
    if timed_out:
        print("FAULT: after qwen3_omni chats that all finished, the stop waited tritonserver's whole exit timeout for "
              "talker requests still in flight and killed the stubs without unloading any model")
        return 1
    return 0


sys.exit(main())
