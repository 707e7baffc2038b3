"""Starts the real launcher (`python -m omni_frontend.serve`: tritonserver + frontend) on free
ports for tests, waits for /health, and stops it with SIGINT like a user pressing Ctrl-C."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from omni_frontend.tritonserver import SHM_ROOT, STOP_WAIT_S, free_ports, shm_name

ROOT = Path(__file__).resolve().parent.parent
TEST_REPOSITORY = ROOT / "tests" / "model_repository"
MAIN_REPOSITORY = ROOT / "model_repository"
# How long a stopped launcher may take: uvicorn's graceful shutdown (5 s), TritonServer.stop (STOP_WAIT_S,
# then 10 s at most of SIGKILL and reaping) and a margin; killing it sooner cuts its cleanup short.
LAUNCHER_STOP_S = 5 + STOP_WAIT_S + 10 + 10


@dataclasses.dataclass
class ServerProcess:
    """A running launcher; base_url is the frontend, grpc_url / metrics_url are Triton's."""

    process: subprocess.Popen
    port: int
    grpc_port: int
    metrics_port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def shm_entries(self) -> list[Path]:
        """This server's /dev/shm entries (Python-backend regions, side channel directory)."""
        return sorted(SHM_ROOT.glob(f"{shm_name(self.process.pid, self.grpc_port)}-*"))

    @property
    def sidechannel_dir(self) -> Path:
        return SHM_ROOT / f"{shm_name(self.process.pid, self.grpc_port)}-sidechannel"

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = LAUNCHER_STOP_S) -> int:
        """SIGINT (Ctrl-C) by default, then wait (SIGKILL after timeout_s); returns the exit code (130 after
        Ctrl-C, 143 after SIGTERM)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


# Triton 2.51's Python backend can abort tritonserver while it launches a stub under load (terminate after
# boost::interprocess::lock_exception; triton-inference-server/server#8882): seen once in a loaded clean-clone run
STARTUP_ABORT = "boost::interprocess::lock_exception"


def start_server(tmp_dir: Path, *args: str, ready_timeout_s: float = 600.0, env: dict | None = None) -> ServerProcess:
    """Launches the server with `args` (e.g. --pipelines ..., --extra-pipeline ...) and waits for
    /health == 200. Raises RuntimeError with the launcher's output if it exits or times out; a launch that
    tritonserver aborted with STARTUP_ABORT (an upstream bug, not ours) is tried once more."""
    try:
        return _start_server(tmp_dir, *args, ready_timeout_s=ready_timeout_s, env=env)
    except RuntimeError:
        triton_log = tmp_dir / "tritonserver.log"
        if not (triton_log.is_file() and STARTUP_ABORT in triton_log.read_text(errors="replace")):
            raise
        triton_log.rename(tmp_dir / "tritonserver-aborted.log")
        return _start_server(tmp_dir, *args, ready_timeout_s=ready_timeout_s, env=env)


def _start_server(tmp_dir: Path, *args: str, ready_timeout_s: float, env: dict | None) -> ServerProcess:
    port, grpc, metrics = free_ports(3)   # Triton's HTTP endpoint stays off, as by default
    log_path = tmp_dir / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "omni_frontend.serve", "--port", str(port), "--triton-grpc-port", str(grpc),
           "--triton-metrics-port", str(metrics), "--log-dir", str(tmp_dir), *args]
    with open(log_path, "wb") as log:
        # run as a background job runs it (SIGINT inherited ignored): the launcher must still stop on Ctrl-C
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env={**os.environ, **(env or {})},
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    server = ServerProcess(process, port, grpc, metrics, log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()[-5000:]}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server not healthy after {ready_timeout_s}s:\n{server.log()[-5000:]}")


def stub_processes(pid: int) -> list:
    """The Triton Python-backend stub processes (psutil.Process) under process `pid` that run now: zombies, and
    processes that exit while being looked at (psutil raises for those), are skipped."""
    import psutil

    stubs = []
    for process in psutil.Process(pid).children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and "triton_python_backend_stub" in " ".join(process.cmdline()):
                stubs.append(process)
        except psutil.Error:
            continue
    return stubs


def metric_value(metrics_url: str, name: str, **labels: str) -> float | None:
    """One sample of a Prometheus metric from Triton's metrics endpoint (None if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(metrics_url, timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def wait_for(predicate, timeout_s: float, interval_s: float = 0.02):
    """Polls predicate() until it returns a truthy value or timeout_s passes; returns the last value."""
    deadline = time.monotonic() + timeout_s
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = predicate()
    return value


def inflight(metrics_url: str) -> dict[str, float]:
    """omni_inflight_requests of every model, from Triton's metrics endpoint."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(metrics_url, timeout=5).text
    return {sample.labels["model"]: sample.value for family in text_string_to_metric_families(text)
            if family.name == "omni_inflight_requests" for sample in family.samples}


def cancel_storm(base_url: str, body: dict, n: int = 100, leave_after_s: float = 1.0, stream: bool = True) -> float:
    """Opens `n` concurrent chat completions with `body` and closes each one mid-way: a streamed one after
    its first content chunk, or after leave_after_s when none came yet; a non-streamed one
    (stream=False) after leave_after_s. Returns time.monotonic() of the last close."""
    async def one(client: httpx.AsyncClient) -> float:
        async def read_until_content(response):
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content") or choices[0].get("delta", {}).get("audio"):
                        return

        async def request():
            if not stream:
                await client.post(f"{base_url}/v1/chat/completions", json={**body, "stream": False})
                return
            async with client.stream("POST", f"{base_url}/v1/chat/completions", json={**body, "stream": True}) as response:
                await read_until_content(response)

        try:  # the 200 head only comes with the first pipeline event: the wait covers the whole request
            await asyncio.wait_for(request(), leave_after_s)
        except (asyncio.TimeoutError, httpx.HTTPError):
            pass
        return time.monotonic()

    async def storm() -> float:
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120), limits=limits) as client:
            return max(await asyncio.gather(*(one(client) for _ in range(n))))

    return asyncio.run(storm())


def settle_time(metrics_url: str, since: float, timeout_s: float = 60.0) -> float | None:
    """Seconds from `since` (time.monotonic()) until every omni_inflight_requests gauge reads 0; None if
    they do not within timeout_s."""
    settled = wait_for(lambda: not any(inflight(metrics_url).values()), timeout_s, 0.02)
    return time.monotonic() - since if settled else None


def settle_limit_s(target_s: float = 2.0) -> float:
    """The cancellation target (2 s on an idle 2-core CI machine), stretched by the host's load: on a
    shared machine with load L on C cores a process gets about C/L of the CPU it would get alone."""
    return target_s * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))

def triton_stream(grpc_url: str, model: str, inputs: dict, timeout_s: float = 300.0, on_response=None) -> list:
    """Sends one request to a decoupled Triton model over gRPC streaming (tritonclient) and returns its
    non-empty responses (InferResult) in order. inputs: name -> numpy array (object arrays for BYTES);
    on_response(result) is called as each response arrives (on tritonclient's thread).
    Fails the test on an error response or when FINAL does not arrive within timeout_s."""
    import threading

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    responses, done = [], threading.Event()

    def callback(result, error):
        responses.append((result, error))
        if error is None and on_response is not None and result.get_response().outputs:
            on_response(result)
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=callback)
    tensors = []
    for name, array in inputs.items():
        tensors.append(grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
        tensors[-1].set_data_from_numpy(array)
    client.async_stream_infer(model, tensors, enable_empty_final_response=True)
    assert done.wait(timeout_s), f"{model} sent no FINAL response within {timeout_s} s"
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in responses), [str(e) for _, e in responses if e]
    return [result for result, _ in responses if result.get_response().outputs]


def overlapping_streams(grpc_url: str, model: str, bodies: list[dict], payload: str) -> list[list[tuple[dict, object]]]:
    """Two REQUESTs (JSON `bodies`) to decoupled `model` (triton_stream), the second sent once the first has
    answered its first response (so it joins while the first runs); each request's (EVENT JSON, `payload`
    output as numpy) pairs, in order."""
    import json
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    running = threading.Event()

    def run(body, on_response=None):
        request = {"REQUEST": np.array([json.dumps(body).encode()], dtype=np.object_)}
        return [(json.loads(r.as_numpy("EVENT")[0]), r.as_numpy(payload)) for r in
                triton_stream(grpc_url, model, request, on_response=on_response)]

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(run, bodies[0], lambda _: running.set())
        assert running.wait(120), f"{model} answered nothing to the first request within 120 s"
        second = run(bodies[1])
        return [first.result(), second]


def batched_finals(bodies: list[dict], results: list[list[tuple[dict, object]]]) -> list[tuple[dict, object]]:
    """Checks that `overlapping_streams` results of a diffusion orchestrator shared a denoiser forward (some
    progress event has batch_jobs 2) and that each request reported steps 1..num_inference_steps; returns each
    request's last (event, payload)."""
    assert max(e["batch_jobs"] for events in results for e, _ in events if e["type"] == "progress") == 2
    for body, events in zip(bodies, results):
        progress = [e for e, _ in events if e["type"] == "progress"]
        assert [e["step"] for e in progress] == list(range(1, body["num_inference_steps"] + 1))
    return [events[-1] for events in results]


def triton_stream_error(grpc_url: str, model: str, body: dict, audio=None, tensors: dict | None = None) -> str | None:
    """The error message of one REQUEST (the JSON `body`) + optional INPUT_AUDIO (float32 samples) and other input
    `tensors` (name -> numpy array) sent straight to decoupled `model` over gRPC streaming (tritonclient), or None
    when it was answered up to its `done` event.

    Reads on to the request's FINAL and then closes the stream without cancelling (as `triton_stream` and the
    frontend's client do): this helper used to cancel its stream as soon as it read `done`, around the FINAL, and
    Triton 2.51 can then keep the request for good (no longer in flight, but its model never unloads), so the shared
    voice server's stop sat out the whole exit timeout with `voice_asr_stream` loaded (docs/reliability.md). Our
    models send an error response together with the FINAL. Only a request still running after 120 s is cancelled."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException, np_to_triton_dtype

    got: queue.Queue = queue.Queue()
    triton = grpcclient.InferenceServerClient(grpc_url)
    triton.start_stream(callback=lambda result, error: got.put((result, error)))
    inputs = [grpcclient.InferInput("REQUEST", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=np.object_))
    if audio is not None:
        inputs.append(grpcclient.InferInput("INPUT_AUDIO", [audio.size], "FP32"))
        inputs[1].set_data_from_numpy(audio.astype(np.float32))
    for name, value in (tensors or {}).items():
        inputs.append(grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype)))
        inputs[-1].set_data_from_numpy(value)
    triton.async_stream_infer(model, inputs, enable_empty_final_response=True)
    done, completed = False, False
    try:
        while True:
            result, error = got.get(timeout=120)
            if error is not None:
                completed = True   # sent with the FINAL (`decoupled.send_final`)
                return error.message() if isinstance(error, InferenceServerException) else str(error)
            event = result.as_numpy("EVENT")
            done = done or (event is not None and json.loads(event[0])["type"] == "done")
            if result.get_response().parameters["triton_final_response"].bool_param:
                completed = True
                return None if done else f"{model} sent its FINAL without a done event"
    finally:
        triton.stop_stream(cancel_requests=not completed)
        triton.close()
