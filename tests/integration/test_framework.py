"""The serving framework end to end: launcher -> tritonserver -> decoupled/BLS models -> frontend,
driven with real clients (openai SDK, httpx, tritonclient). Uses the framework test models in
tests/model_repository (never pipelines)."""
from __future__ import annotations

import io
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import psutil
import pytest
import soundfile
import tritonclient.grpc as grpcclient

from omni_frontend.tritonserver import EXIT_TIMEOUT_S, free_port, free_ports
from tests.conftest import MOCK_ARGS, hold_load_file
from tests.harness import (TEST_REPOSITORY, cancel_storm, inflight, metric_value, settle_limit_s, settle_time,
                           start_server, stub_processes, triton_stream, wait_for)

pytestmark = pytest.mark.integration


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_health_and_models(mock_server):
    health = httpx.get(f"{mock_server.base_url}/health")
    assert health.status_code == 200 and health.json()["models"] == ["mock_stream", "mock_relay", "mock_asr"]
    assert health.headers["x-request-id"]
    models = _client(mock_server).models.list()
    assert [m.id for m in models.data] == ["mock", "relay", "mock-speech", "mock-asr"]
    assert all(m.object == "model" for m in models.data)


@pytest.mark.parametrize("model", ["mock", "relay"])
def test_stream_receives_every_chunk_in_order(mock_server, model):
    stream = _client(mock_server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}, extra_body={"repeat": 12, "text": "t"})
    chunks = list(stream)
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts == [f"t{i}" for i in range(12)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_non_streamed_completion(mock_server):
    reply = _client(mock_server).chat.completions.create(
        model="relay", messages=[{"role": "user", "content": "hi"}], extra_body={"repeat": 3, "text": "x"})
    assert reply.choices[0].message.content == "x0x1x2"
    assert reply.choices[0].finish_reason == "stop" and reply.usage.total_tokens == 3


@pytest.mark.parametrize("model, cancelled_models", [("mock", ["mock_stream"]),
                                                     ("relay", ["mock_relay", "mock_stream"])])
def test_client_disconnect_cancels_the_model_within_1s(mock_server, model, cancelled_models):
    metrics = mock_server.metrics_url
    before = {m: metric_value(metrics, "omni_requests_total", model=m, outcome="cancelled") or 0
              for m in cancelled_models}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "repeat": 1000, "delay_ms": 20}
    with httpx.stream("POST", f"{mock_server.base_url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        got = None
        for line in response.iter_lines():  # read until the first text delta arrived, then hang up
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                got = line
                break
    closed_at = time.monotonic()
    assert got
    for m in cancelled_models:
        observed = wait_for(lambda m=m: (metric_value(metrics, "omni_requests_total", model=m, outcome="cancelled")
                                         or 0) > before[m], timeout_s=1.0)
        assert observed, f"{m} did not observe the cancellation within 1 s"
    assert time.monotonic() - closed_at < 1.5
    for m in cancelled_models:
        assert wait_for(lambda m=m: metric_value(metrics, "omni_inflight_requests", model=m) == 0, 1.0)
    # ... and the server keeps serving.
    assert _client(mock_server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "again"}], extra_body={"repeat": 2}).choices[0]


def test_triton_grpc_clients_drive_pipeline_models_directly(mock_server):
    """Client-facing models speak plain Triton tensors: any gRPC streaming client works."""
    responses = []
    client = grpcclient.InferenceServerClient(mock_server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.append((result, error)))
    tensor = grpcclient.InferInput("REQUEST", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps({"repeat": 2, "audio": True}).encode()], dtype=np.object_))
    client.async_stream_infer("mock_relay", [tensor], enable_empty_final_response=True)
    assert wait_for(lambda: any(r and r.get_response().parameters["triton_final_response"].bool_param
                                for r, _ in responses), 10)
    client.stop_stream()
    events = [json.loads(r.as_numpy("EVENT")[0]) for r, e in responses if r is not None and r.as_numpy("EVENT") is not None]
    assert [e["type"] for e in events] == ["text.delta", "audio.delta", "text.delta", "audio.delta", "done"]
    audio = [r.as_numpy("AUDIO") for r, _ in responses if r is not None and r.as_numpy("AUDIO") is not None]
    assert [a.shape for a in audio] == [(0,), (100,), (0,), (100,), (0,)] and audio[1].dtype == np.float32


@pytest.mark.parametrize("body, status, param", [
    ("{not json", 400, None),
    (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}), 404, "model"),
    (json.dumps({"model": "mock", "messages": "x"}), 400, "messages"),
    (json.dumps({"model": "mock", "messages": []}), 400, "messages"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}), 400, "temperature"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}), 400, "max_tokens"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x"}], "seed": 2**70}), 400, "seed"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x"}], "max_tokens": "10"}), 400, "max_tokens"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}), 400, "stream"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": "x"}], "reject": True}), 400, "reject"),
    (json.dumps({"model": "mock", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), 400,
     "messages[0].content[0].type"),
])
def test_bad_requests_get_openai_errors(mock_server, body, status, param):
    response = httpx.post(f"{mock_server.base_url}/v1/chat/completions", content=body,
                          headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert httpx.get(f"{mock_server.base_url}/health").status_code == 200


def test_model_failure_mid_stream_is_reported_and_server_survives(mock_server):
    with pytest.raises(openai.InternalServerError) as info:
        _client(mock_server).chat.completions.create(
            model="relay", messages=[{"role": "user", "content": "hi"}], extra_body={"fail_at": 1})
    assert "mock failure at 1" in str(info.value)
    texts = []
    with pytest.raises(openai.APIError, match="mock failure at 2"):
        for chunk in _client(mock_server).chat.completions.create(
                model="relay", messages=[{"role": "user", "content": "hi"}], stream=True,
                extra_body={"fail_at": 2, "repeat": 5}):
            texts += [c.delta.content for c in chunk.choices if c.delta.content]
    assert texts == ["tok0", "tok1"]
    assert _client(mock_server).chat.completions.create(
        model="mock", messages=[{"role": "user", "content": "ok?"}]).choices[0].message.content == "tok0tok1tok2"


def test_json_null_for_optional_fields_is_their_default_through_the_server(mock_server):
    """`"n": null`, `"stream": null` (what clients that serialise unset fields send) were 400s: now the defaults, a
    whole non-streamed answer; null for a required field is still a 400 naming it."""
    body = {"model": "mock", "messages": [{"role": "user", "content": "ok?"}]}
    reply = httpx.post(f"{mock_server.base_url}/v1/chat/completions", json={**body, "n": None, "stream": None,
                                                                            "stream_options": None}, timeout=30)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "tok0tok1tok2", reply.text
    refused = httpx.post(f"{mock_server.base_url}/v1/chat/completions", json={**body, "messages": None}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages", refused.text


def test_frontend_metrics_carry_tritons_too(mock_server):
    """The public port's /metrics is one scrape for everything: the frontend's families and Triton's (whose own
    port listens on 127.0.0.1 only, unreachable from outside a container), parseable as one Prometheus page."""
    from prometheus_client.parser import text_string_to_metric_families

    httpx.get(f"{mock_server.base_url}/v1/models")
    text = httpx.get(f"{mock_server.base_url}/metrics").text
    assert 'omni_frontend_requests_total{method="GET",route="/v1/models",status="200"}' in text
    assert "omni_frontend_request_seconds_bucket" in text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    beats = {s.labels["model"]: s.value for s in families["omni_model_heartbeat_seconds"].samples}
    assert "mock_stream" in beats and abs(beats["mock_stream"] - time.time()) < 30, beats
    assert "nv_inference_count" in families and "omni_inflight_requests" in families
    triton = httpx.get(mock_server.metrics_url).text   # the same families as Triton's own page
    assert {f.name for f in text_string_to_metric_families(triton)} <= set(families)


def test_head_answers_as_get_without_a_body_and_multipart_text_must_be_utf8(mock_server):
    """HEAD on GET routes was 405 (a HEAD-based health probe saw the server as down): now GET's status and headers,
    no body; a POST-only route still says 405. A multipart text field that is not UTF-8 was read as Latin-1 (a
    prompt the client never sent); now a 400 naming the field, as invalid text in a JSON body."""
    with httpx.Client(base_url=mock_server.base_url, timeout=30) as client:
        for path in ("/health", "/v1/models", "/metrics"):
            head, get = client.head(path), client.get(path)
            assert head.status_code == get.status_code == 200 and head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"], path
        assert client.head("/v1/chat/completions").status_code == 405
        wav = io.BytesIO()
        soundfile.write(wav, np.zeros(1600, np.float32), 16000, format="WAV")
        reply = client.post("/v1/audio/transcriptions", files={"file": ("a.wav", wav.getvalue(), "audio/wav")},
                            data={"model": "mock-asr", "prompt": "café ÿ"})
        assert reply.status_code == 200, reply.text   # httpx sends str fields as UTF-8: valid
        body, boundary = b"", b"b0undary"
        for name, value, extra in ((b"model", b"mock-asr", b""), (b"prompt", b"a red\xff cube", b""),
                                   (b"file", wav.getvalue(), b'; filename="a.wav"\r\nContent-Type: audio/wav')):
            body += b"--" + boundary + b'\r\nContent-Disposition: form-data; name="' + name + b'"' + extra + \
                b"\r\n\r\n" + value + b"\r\n"
        body += b"--" + boundary + b"--\r\n"
        reply = client.post("/v1/audio/transcriptions", content=body,
                            headers={"content-type": "multipart/form-data; boundary=b0undary"})
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "invalid_unicode" and error["param"] == "prompt", error


def _relay_chat_in_flight(pool: ThreadPoolExecutor, server, body: dict):
    """The future of chat `body` (a long `relay` one) sent on `pool`, once mock_relay is running it."""
    in_flight = pool.submit(httpx.post, f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert wait_for(lambda: metric_value(server.metrics_url, "omni_inflight_requests", model="mock_relay") == 1, 30)
    return in_flight


def _live_stubs(server) -> list[str]:
    """Models whose stub process runs now (from the stubs' command lines)."""
    names = []
    for p in stub_processes(server.process.pid):
        try:
            names.append(p.cmdline()[1].split("/")[-3])
        except psutil.Error:   # exited since
            continue
    return sorted(names)


def test_api_key_dead_stage_recovery_and_clean_shutdown(tmp_path):
    """A separate server: Bearer auth (admin routes too); a killed stage stub fails the requests in flight
    through it with 503 at once, /health names it, the launcher reloads it without a restart and it serves
    again; SIGTERM then leaves no process (alive or defunct) and no /dev/shm entry of the server."""
    server = start_server(tmp_path, "--pipelines", "", "--model-repository", str(TEST_REPOSITORY),
                          "--extra-pipeline", "relay=chat:mock_stream,mock_relay", "--api-key", "sekret")
    auth = {"authorization": "Bearer sekret"}
    chat_url = f"{server.base_url}/v1/chat/completions"
    try:
        url = f"{server.base_url}/v1/models"
        denied = httpx.get(url)
        assert denied.status_code == 401 and denied.json()["error"]["type"] == "authentication_error"
        assert httpx.get(url, headers=auth).status_code == 200
        models = httpx.get(url, headers={"authorization": "bearer sekret"})   # the scheme name in any case
        assert models.status_code == 200 and "relay" in [m["id"] for m in models.json()["data"]]
        page = httpx.get(f"{server.base_url}/realtime")   # a browser opens the page without the header
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert httpx.post(f"{server.base_url}/v1/admin/pipelines/relay/sleep").status_code == 401
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),   # vLLM's, not /v1
                             ("POST", "/v1/responses"), ("POST", "/v1/audio/speech/batch")):
            assert httpx.request(method, f"{server.base_url}{path}", headers={"authorization": "Bearer sekre"}
                                 ).status_code == 401, path
        assert server.shm_entries(), "the server's shared-memory regions carry its own prefix"
        stubs = stub_processes(server.process.pid)
        assert len(stubs) == 2
        victim = next(p for p in stubs if "mock_stream/1/model.py" in " ".join(p.cmdline()))
        # One token a second: the stub is killed while it sleeps, not while it holds one of the Python
        # backend's shared-memory locks (a stub killed inside a send can abort tritonserver itself with
        # boost::interprocess::lock_exception, which no model-level recovery can catch).
        long_body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "repeat": 100, "delay_ms": 1000}
        with ThreadPoolExecutor(2) as pool:
            in_flight = [pool.submit(httpx.post, chat_url, json=long_body, headers=auth, timeout=120) for _ in range(2)]
            assert wait_for(lambda: metric_value(server.metrics_url, "omni_inflight_requests", model="mock_stream") == 2, 30)
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            unhealthy = wait_for(lambda: (r := httpx.get(f"{server.base_url}/health")).status_code == 503 and r, 15, 0.05)
            failed = [f.result() for f in in_flight]
            failed_after = time.monotonic() - killed
        assert unhealthy, "health stayed 200 after the stub died"
        assert unhealthy.json()["not_ready"] == ["mock_stream"]
        for response in failed:  # not a hang until the client's timeout
            error = response.json()["error"]
            assert response.status_code == 503 and error["code"] == "model_unavailable" and "mock_stream" in error["message"]
        assert failed_after < 30
        assert wait_for(lambda: httpx.get(f"{server.base_url}/health").status_code == 200, 60, 0.1), server.log()[-3000:]
        recovered_after = time.monotonic() - killed
        reply = httpx.post(chat_url, headers=auth, json={"model": "relay", "messages": [{"role": "user", "content": "x"}]})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "tok0tok1tok2"
        assert _live_stubs(server) == ["mock_relay", "mock_stream"]  # a fresh mock_stream stub
        assert "stage mock_stream recovered in" in server.log()
        print(f"in-flight requests failed {failed_after:.2f} s after the kill; /health 200 again after {recovered_after:.2f} s")
        children = psutil.Process(server.process.pid).children(recursive=True)
    finally:
        stopping = time.monotonic()
        assert server.stop(signal.SIGTERM) == 143
        stop_s = time.monotonic() - stopping
    assert not [p for p in children if p.is_running()], "a stub process (alive or defunct) outlived the server"
    assert server.shm_entries() == []
    # mock_relay, still reading a stream of the killed stub, can never unload: tritonserver's own exit sat out its
    # exit timeout (EXIT_TIMEOUT_S = 30 s) for it; the launcher unloads what can unload and stops the rest.
    assert "models mock_relay cannot unload" in server.log() and stop_s < EXIT_TIMEOUT_S, (stop_s, server.log()[-2000:])


def test_a_stage_killed_while_its_pipeline_falls_asleep_fails_its_requests_at_once(tmp_path):
    """A separate server (the killed stub's requests never end in Triton): two chats stream through relay, relay is
    put to sleep (draining them) and mock_stream's stub is SIGKILLed meanwhile. The requests in flight get 503
    `model_unavailable` at once, as for an awake pipeline, and the sleep ends without waiting UNLOAD_WAIT_S for the
    dead stage (the stage monitor skipped pipelines that were not awake: the requests hung until the client's
    timeout, holding the sleep); the frontend's gauges are back to 0, and after the wake the stage is reloaded and
    serves again (Triton still read the dead model READY, so the wake alone kept it: every request got 503)."""
    server = start_server(tmp_path, "--pipelines", "", "--model-repository", str(TEST_REPOSITORY),
                          "--extra-pipeline", "relay=chat:mock_stream,mock_relay")
    admin = f"{server.base_url}/v1/admin/pipelines"
    body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "repeat": 100, "delay_ms": 1000}
    try:
        with ThreadPoolExecutor(3) as pool:
            chats = [pool.submit(httpx.post, f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
                     for _ in range(2)]
            assert wait_for(lambda: metric_value(server.metrics_url, "omni_inflight_requests", model="mock_stream") == 2, 30)
            sleep = pool.submit(httpx.post, f"{admin}/relay/sleep", timeout=120)
            assert wait_for(lambda: httpx.get(admin).json()["data"][0]["state"] == "falling_asleep", 10)
            victim = next(p for p in stub_processes(server.process.pid) if "mock_stream/1/model.py" in " ".join(p.cmdline()))
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            failed = [chat.result() for chat in chats]
            failed_after = time.monotonic() - killed
            slept, slept_after = sleep.result().json(), time.monotonic() - killed
        for response in failed:
            assert response.status_code == 503 and response.json()["error"]["code"] == "model_unavailable", response.text
        assert failed_after < 10 and slept_after < 20, (failed_after, slept_after)
        assert slept["state"] == "sleeping" and slept["pending"] == ["mock_relay", "mock_stream"], slept
        health = httpx.get(f"{server.base_url}/health")
        assert health.status_code == 200 and health.json()["sleeping"] == ["relay"]
        assert 'omni_frontend_inflight_requests{pipeline="relay"} 0.0' in httpx.get(f"{server.base_url}/metrics").text
        # awake, with the dead stage down until the monitor's reload: "recovering", then /health 200
        assert httpx.post(f"{admin}/relay/wake", timeout=120).json()["state"] == "recovering"
        assert wait_for(lambda: httpx.get(f"{server.base_url}/health").status_code == 200, 30, 0.1)
        assert httpx.get(admin).json()["data"][0]["state"] == "awake"
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=30,
                           json={"model": "relay", "messages": [{"role": "user", "content": "x"}]})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "tok0tok1tok2", reply.text
    finally:
        server.stop()


def test_sleep_and_wake_unload_and_reload_models(mock_server):
    """mock, relay and mock-speech share mock_stream: sleeping relay unloads only mock_relay; sleeping mock
    keeps mock_stream while mock-speech is awake, sleeping mock-speech then unloads it; waking relay loads
    both back. mock-asr's model is never touched."""
    base = mock_server.base_url
    admin = f"{base}/v1/admin/pipelines"

    def chat(model):
        return httpx.post(f"{base}/v1/chat/completions", timeout=60,
                          json={"model": model, "messages": [{"role": "user", "content": "hi"}]})

    def states():
        return {m["id"]: m["state"] for m in httpx.get(f"{base}/v1/models").json()["data"]}

    died = mock_server.log().count("stub process")   # "stage X: its stub process (pid N) died"
    try:
        assert _live_stubs(mock_server) == ["mock_asr", "mock_relay", "mock_stream"]
        slept = httpx.post(f"{admin}/relay/sleep", timeout=120).json()
        assert (slept["state"], slept["unloaded"], slept["kept"]) == ("sleeping", ["mock_relay"], ["mock_stream"])
        assert wait_for(lambda: _live_stubs(mock_server) == ["mock_asr", "mock_stream"], 30), "the unload did not end the stub"
        asleep = chat("relay")
        assert asleep.status_code == 503 and asleep.json()["error"]["code"] == "pipeline_sleeping"
        assert chat("mock").status_code == 200
        assert states() == {"mock": "awake", "relay": "sleeping", "mock-speech": "awake", "mock-asr": "awake"}
        health = httpx.get(f"{base}/health")
        assert health.status_code == 200 and health.json()["sleeping"] == ["relay"]
        assert httpx.post(f"{admin}/mock/sleep", timeout=120).json()["unloaded"] == []  # mock-speech still uses it
        assert httpx.post(f"{admin}/mock-speech/sleep", timeout=120).json()["unloaded"] == ["mock_stream"]
        assert wait_for(lambda: _live_stubs(mock_server) == ["mock_asr"], 30), "the unload did not end the stub"
        woke = httpx.post(f"{admin}/relay/wake", timeout=120).json()
        assert (woke["state"], woke["loaded"]) == ("awake", ["mock_stream", "mock_relay"])
        assert chat("relay").json()["choices"][0]["message"]["content"] == "tok0tok1tok2"
        assert chat("mock").json()["error"]["code"] == "pipeline_sleeping"
        assert httpx.post(f"{admin}/mock/wake", timeout=120).json()["loaded"] == []
        assert httpx.post(f"{admin}/mock-speech/wake", timeout=120).json()["loaded"] == []
        missing = httpx.post(f"{admin}/nope/sleep")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "pipeline_not_found"
        assert [p["state"] for p in httpx.get(admin).json()["data"]] == ["awake"] * 4
        # an unloaded stub is a zombie until tritonserver reaps it: not a stage that died
        assert mock_server.log().count("stub process") == died, mock_server.log()[-3000:]
    finally:
        for name in ("mock", "relay", "mock-speech"):
            httpx.post(f"{admin}/{name}/wake", timeout=120)
    assert httpx.get(f"{base}/health").status_code == 200


def test_vllm_sleep_endpoints_sleep_and_wake_every_pipeline(mock_server):
    """vLLM's whole-server POST /sleep, POST /wake_up and GET /is_sleeping: every pipeline sleeps (its models
    unloaded, its requests 503) and wakes; a level, mode or tag outside what a sleep does here is a 400 envelope
    naming it, and nothing changes."""
    base = mock_server.base_url

    def chat(model):
        return httpx.post(f"{base}/v1/chat/completions", timeout=60,
                          json={"model": model, "messages": [{"role": "user", "content": "hi"}]})

    try:
        assert httpx.get(f"{base}/is_sleeping").json() == {"is_sleeping": False}
        for query, param in (("level=3", "level"), ("level=x", "level"), ("mode=abort", "mode")):
            refused = httpx.post(f"{base}/sleep?{query}")
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text
        assert httpx.get(f"{base}/is_sleeping").json() == {"is_sleeping": False} and chat("mock").status_code == 200
        slept = httpx.post(f"{base}/sleep?level=2", timeout=180)
        assert slept.status_code == 200, slept.text
        assert slept.json()["is_sleeping"] is True and set(slept.json()["pipelines"]) == {"mock", "relay", "mock-speech",
                                                                                           "mock-asr"}
        assert wait_for(lambda: _live_stubs(mock_server) == [], 30), "the sleep did not end the stubs"
        assert httpx.get(f"{base}/is_sleeping").json() == {"is_sleeping": True}
        assert chat("relay").json()["error"]["code"] == "pipeline_sleeping"
        bad_tag = httpx.post(f"{base}/wake_up?tags=optimizer")
        assert bad_tag.status_code == 400 and bad_tag.json()["error"]["param"] == "tags"
        woke = httpx.post(f"{base}/wake_up?tags=weights&tags=kv_cache", timeout=180).json()
        loaded = sorted(m for result in woke["pipelines"].values() for m in result["loaded"])
        assert woke["is_sleeping"] is False and loaded == ["mock_asr", "mock_relay", "mock_stream"], woke
        assert httpx.get(f"{base}/is_sleeping").json() == {"is_sleeping": False}
        assert chat("relay").json()["choices"][0]["message"]["content"] == "tok0tok1tok2"
        assert _live_stubs(mock_server) == ["mock_asr", "mock_relay", "mock_stream"]
    finally:
        httpx.post(f"{base}/wake_up", timeout=180)
    assert httpx.get(f"{base}/health").status_code == 200


def test_the_whole_server_sleep_refuses_every_pipeline_at_once_and_lets_requests_in_flight_finish(mock_server):
    """Thirteenth outside test: vLLM's POST /sleep slept the pipelines one after another, so those after the one
    draining went on admitting new requests meanwhile (qwen3_omni answered 80 chats with 200 for the 80 s voice took
    to drain). Every pipeline now refuses at once: while relay drains a 3 s chat, mock-speech (slept after it) is
    already 503 `pipeline_sleeping`; the chat in flight still completes, and the frontend's gauges end at 0."""
    base = mock_server.base_url
    long_body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "repeat": 12, "delay_ms": 250}
    speech = {"model": "mock-speech", "input": "hi", "voice": "alloy"}
    try:
        with ThreadPoolExecutor(2) as pool:
            in_flight = _relay_chat_in_flight(pool, mock_server, long_body)
            slept = pool.submit(httpx.post, f"{base}/sleep", timeout=180)
            assert wait_for(lambda: httpx.get(f"{base}/v1/admin/pipelines").json()["data"][1]["state"]
                            == "falling_asleep", 10)
            refused = httpx.post(f"{base}/v1/audio/speech", json=speech, timeout=30)
            assert not in_flight.done(), "the chat ended before the speech request was sent"
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "pipeline_sleeping", refused.content[:100]
            assert httpx.get(f"{base}/is_sleeping").json() == {"is_sleeping": True}
            answer, slept = in_flight.result(), slept.result()
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "".join(
            f"tok{i}" for i in range(12)), answer.text
        assert slept.status_code == 200 and all(r["pending"] == [] for r in slept.json()["pipelines"].values())
        assert wait_for(lambda: _live_stubs(mock_server) == [], 30), "the sleep did not end the stubs"
        metrics = httpx.get(f"{base}/metrics").text
        assert 'omni_frontend_inflight_requests{pipeline="relay"} 0.0' in metrics
    finally:
        httpx.post(f"{base}/wake_up", timeout=180)
    assert httpx.post(f"{base}/v1/audio/speech", json=speech, timeout=30).status_code == 200


def test_health_stays_200_while_a_pipeline_drains_to_sleep_and_wakes(mock_server):
    """Sleeping relay with a request in flight: its unload waits for the request, and Triton's strict readiness
    is false meanwhile (as while the wake loads mock_relay). /health used to equate that with a dead server (503
    "tritonserver is not ready"); it judges only awake pipelines, so it stays 200, reports relay as
    falling_asleep / waking, and the other pipelines keep serving."""
    base = mock_server.base_url
    admin = f"{base}/v1/admin/pipelines"
    long_body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "repeat": 12, "delay_ms": 250}

    def probe_until(future) -> tuple[list[int], set[str]]:
        codes, relay_states = [], set()
        while True:
            finished = future.done()
            health = httpx.get(f"{base}/health", timeout=30)
            codes.append(health.status_code)
            relay_states.add(health.json().get("pipelines", {}).get("relay"))
            if finished:
                return codes, relay_states
            time.sleep(0.05)

    try:
        with ThreadPoolExecutor(2) as pool:
            in_flight = _relay_chat_in_flight(pool, mock_server, long_body)
            slept = pool.submit(httpx.post, f"{admin}/relay/sleep", timeout=120)
            draining, drain_states = probe_until(slept)
            assert in_flight.result().status_code == 200 and slept.result().json()["unloaded"] == ["mock_relay"]
            woke = pool.submit(httpx.post, f"{admin}/relay/wake", timeout=120)
            waking, wake_states = probe_until(woke)
            assert woke.result().json()["loaded"] == ["mock_relay"]
        assert set(draining) == {200} and "falling_asleep" in drain_states, (draining, drain_states)
        assert set(waking) == {200} and "waking" in wake_states, (waking, wake_states)
        assert httpx.get(f"{base}/health").json()["pipelines"]["relay"] == "awake"
    finally:
        httpx.post(f"{admin}/relay/wake", timeout=120)


def _stub_pids(server, model: str) -> list[int]:
    """Pids of `model`'s stub processes that run now."""
    pids = []
    for p in stub_processes(server.process.pid):
        try:
            if f"/{model}/1/model.py" in " ".join(p.cmdline()):
                pids.append(p.pid)
        except psutil.Error:   # exited since
            continue
    return pids


def test_a_wake_after_one_that_failed_on_a_dead_stub_serves_at_once_without_a_reload(mock_server):
    """Sleeping relay unloads mock_relay; the next wake's load of it is held in the model's setup (hold_load_file)
    and its stub SIGKILLed there, so that wake fails (503) and the stage monitor marks mock_relay down until relay is
    awake. The wake after it loads mock_relay afresh: it answers `awake`, relay serves at once and the stub the wake
    started is kept. (The monitor took the stage for dead still and reloaded the stub the wake had just loaded: the
    wake answered `recovering` and requests got 503 `model_unavailable` for the seconds of the reload.)"""
    base = mock_server.base_url
    admin = f"{base}/v1/admin/pipelines"
    hold = hold_load_file(mock_server)

    def chat():
        return httpx.post(f"{base}/v1/chat/completions", timeout=60,
                          json={"model": "relay", "messages": [{"role": "user", "content": "hi"}]})

    def relay_state():
        return {p["id"]: p["state"] for p in httpx.get(admin).json()["data"]}["relay"]

    try:
        assert httpx.post(f"{admin}/relay/sleep", timeout=120).json()["unloaded"] == ["mock_relay"]
        assert wait_for(lambda: not _stub_pids(mock_server, "mock_relay"), 30), "the unload did not end the stub"
        hold.touch()
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, f"{admin}/relay/wake", timeout=120)
            loading = wait_for(lambda: _stub_pids(mock_server, "mock_relay"), 30)
            assert loading, "the wake started no mock_relay stub"
            time.sleep(1.5)   # the launcher has seen it running (it looks every 0.5 s)
            assert not first.done()
            os.kill(loading[0], signal.SIGKILL)
            hold.unlink()
            failed = first.result()
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "model_control_failed", failed.text
        assert wait_for(lambda: f"stage mock_relay: its stub process (pid {loading[0]}) died" in mock_server.log(), 10)
        assert relay_state() == "sleeping"
        woke = httpx.post(f"{admin}/relay/wake", timeout=120)
        assert woke.status_code == 200, woke.text
        assert (woke.json()["state"], woke.json()["loaded"]) == ("awake", ["mock_relay"]), woke.json()
        fresh = _stub_pids(mock_server, "mock_relay")
        reply = chat()
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "tok0tok1tok2", reply.text
        assert httpx.get(f"{base}/health").status_code == 200
        time.sleep(3)   # the monitor retries a pending restart every 2 s
        assert _stub_pids(mock_server, "mock_relay") == fresh, "the stub the wake loaded was restarted"
        assert chat().status_code == 200 and relay_state() == "awake"
    finally:
        hold.unlink(missing_ok=True)
        httpx.post(f"{admin}/relay/wake", timeout=120)


def test_sleep_unloads_a_stage_only_after_its_caller_drained(mock_server):
    """relay's request calls mock_stream three times, one after another (as `tts` calls voice_tts once per chunk);
    with mock and mock-speech asleep nothing else keeps mock_stream. Sleeping relay mid-request used to unload
    mock_stream as soon as its current call ended, so the next call failed ("model is not ready") and the
    client's answer was cut; now mock_relay drains first, then its stage unloads."""
    base = mock_server.base_url
    admin = f"{base}/v1/admin/pipelines"
    body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "calls": 3, "repeat": 4,
            "delay_ms": 200}
    try:
        for name in ("mock", "mock-speech"):
            assert httpx.post(f"{admin}/{name}/sleep", timeout=120).json()["unloaded"] == []   # relay needs it
        with ThreadPoolExecutor(2) as pool:
            in_flight = pool.submit(httpx.post, f"{base}/v1/chat/completions", json=body, timeout=60)
            assert wait_for(lambda: metric_value(mock_server.metrics_url, "omni_inflight_requests",
                                                 model="mock_stream") == 1, 30)
            slept = pool.submit(httpx.post, f"{admin}/relay/sleep", timeout=120).result().json()
            answer = in_flight.result()
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "tok0tok1tok2tok3" * 3
        assert (slept["unloaded"], slept["pending"]) == (["mock_relay", "mock_stream"], [])
        assert wait_for(lambda: _live_stubs(mock_server) == ["mock_asr"], 30), "the unload did not end the stubs"
    finally:
        for name in ("relay", "mock", "mock-speech"):
            httpx.post(f"{admin}/{name}/wake", timeout=120)


@pytest.mark.parametrize("model", ["mock", "relay"])
def test_cancel_storm_leaves_every_gauge_at_zero(mock_server, model):
    """100 streams cancelled mid-way: every stage's in-flight gauge is back to 0 within 2 s."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "repeat": 1000, "delay_ms": 20}
    last_close = cancel_storm(mock_server.base_url, body, n=100)
    settled = settle_time(mock_server.metrics_url, last_close)
    print(f"cancel storm on {model}: gauges at 0 {settled} s after the last close")
    assert settled is not None and settled <= settle_limit_s(), inflight(mock_server.metrics_url)
    assert _client(mock_server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], extra_body={"repeat": 2}).choices[0]


def test_bls_responses_are_freed_holding_the_gil(mock_server):
    """Regression (the qwen3_omni orchestrator died with SIGSEGV inside libpython's allocator, or hung, in
    loaded suite runs): a finished BLS response iterator must never be destroyed by the stub's clean-up
    thread, which frees the stream's arrays without the GIL. The relay leaves each child stream before its
    FINAL, as qwen3_omni leaves the thinker's: dropped at once after the drain, 8 such streams crashed the
    relay's stub every time."""
    def relay(body: dict) -> list[dict]:
        inputs = {"REQUEST": np.array([json.dumps(body).encode()], dtype=np.object_)}
        return [json.loads(r.as_numpy("EVENT")[0]) for r in triton_stream(mock_server.grpc_url, "mock_relay", inputs,
                                                                          timeout_s=30)]

    with ThreadPoolExecutor(8) as pool:
        streams = list(pool.map(lambda _: relay({"repeat": 3, "probe_release": True}), range(16)))
    assert all([e["type"] for e in events] == ["text.delta"] * 3 + ["done"] for events in streams)
    report = wait_for(lambda: (r := relay({"action": "release_report"})[0])["freed"] == r["probed"] and r, 15, 0.2)
    assert report, relay({"action": "release_report"})[0]
    assert report["probed"] >= 16 * 4 and report["freed_without_gil"] == 0, report


def test_a_killed_bls_parent_stops_its_children_at_once(mock_server):
    """kill -9 of an orchestrator stub (mock_relay) mid-request: the child requests it had in flight in
    mock_stream (a token a second for 100 s) stop within a few seconds, as the child sees its parent's
    process gone (`sidechannel.owner_gone`), not when their work runs out; the reloaded relay serves."""
    metrics, chat_url = mock_server.metrics_url, f"{mock_server.base_url}/v1/chat/completions"
    stubs = psutil.Process(mock_server.process.pid).children(recursive=True)
    victim = next(p for p in stubs if "mock_relay/1/model.py" in " ".join(p.cmdline()))
    body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "repeat": 100, "delay_ms": 1000}
    with ThreadPoolExecutor(2) as pool:
        in_flight = [pool.submit(httpx.post, chat_url, json=body, timeout=120) for _ in range(2)]
        assert wait_for(lambda: metric_value(metrics, "omni_inflight_requests", model="mock_stream") == 2, 30)
        os.kill(victim.pid, signal.SIGKILL)   # idle between tokens: not inside one of the backend's locks
        killed = time.monotonic()
        stopped = wait_for(lambda: metric_value(metrics, "omni_inflight_requests", model="mock_stream") == 0, 30, 0.05)
        stopped_after = time.monotonic() - killed
        failed = [f.result() for f in in_flight]
    print(f"children of the killed relay stopped {stopped_after:.2f} s after the kill")
    assert stopped and stopped_after <= settle_limit_s(3.0), inflight(metrics)
    assert [r.status_code for r in failed] == [503, 503]
    assert metric_value(metrics, "omni_requests_total", model="mock_stream", outcome="cancelled") >= 2
    assert wait_for(lambda: httpx.get(f"{mock_server.base_url}/health").status_code == 200, 60, 0.1)
    assert _client(mock_server).chat.completions.create(
        model="relay", messages=[{"role": "user", "content": "hi"}], extra_body={"repeat": 2}
    ).choices[0].message.content == "tok0tok1"


def test_ctrl_c_leaves_no_process_behind_and_no_stub_crashes(tmp_path):
    """Every stub stops cleanly: before, a heartbeat written after the model's finalize killed stubs with
    SIGSEGV during the shutdown ("Fatal Python error: Segmentation fault" with the stack of the heartbeat
    thread in the log). The stubs beat every second and the unload takes seconds, so several of them
    crashed at almost every Ctrl-C; so did a BLS parent's finished response iterators freed only when the
    interpreter exited (`retire.release`), and requests that a failed batch row's traceback kept in a reference
    cycle (collected at finalize now)."""
    server = start_server(tmp_path, *MOCK_ARGS)
    children = psutil.Process(server.process.pid).children(recursive=True)
    assert any("tritonserver" in " ".join(p.cmdline()) for p in children)
    for _ in range(3):   # BLS streams through the relay: finished response iterators parked in its stub
        assert _client(server).chat.completions.create(
            model="relay", messages=[{"role": "user", "content": "hi"}], extra_body={"repeat": 2}
        ).choices[0].message.content == "tok0tok1"
    wav = io.BytesIO()
    soundfile.write(wav, np.zeros(1600, np.float32), 16000, format="WAV")
    with ThreadPoolExecutor(3) as pool:   # a batch of mock_asr (BatchStageModel) in which one row fails
        codes = list(pool.map(lambda prompt: httpx.post(
            f"{server.base_url}/v1/audio/transcriptions", timeout=30, data={"model": "mock-asr", "prompt": prompt},
            files={"file": ("a.wav", wav.getvalue(), "audio/wav")}).status_code, ["sleep 0.4", "sleep 0.1", "fail"]))
    assert sorted(codes) == [200, 200, 400]
    beats = lambda: [metric_value(server.metrics_url, "omni_model_heartbeat_seconds", model=m)  # noqa: E731
                     for m in ("mock_stream", "mock_relay", "mock_asr")]
    first = beats()
    assert wait_for(lambda: all(now > then for now, then in zip(beats(), first)), 10, 0.1)   # every stub beat again
    assert server.stop(signal.SIGINT) == 130
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    log = server.log() + "".join(f.read_text(errors="replace") for f in tmp_path.glob("tritonserver*.log"))
    assert "tritonserver stopped" in log and "Fatal Python error" not in log


def test_launcher_reports_port_in_use_and_missing_model(tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "omni_frontend.serve", "--port", str(port), "--no-prepare"],
                              capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"port 127.0.0.1:{port} is already in use" in done.stderr
    # `--pipelines ''` is fine beside an --extra-pipeline (only a run that names no pipeline at all is refused)
    done = subprocess.run([sys.executable, "-m", "omni_frontend.serve", "--pipelines", "", "--no-prepare",
                           "--extra-pipeline", "x=chat:no_such_model", "--model-repository", str(TEST_REPOSITORY),
                           "--port", str(free_port()), "--log-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no_such_model not found" in done.stderr


@pytest.mark.parametrize("case, exit_code, line", [
    (["--port", "70000"], 2, "error: argument --port: must be 1-65535, got 70000"),
    (["--port", "-5"], 2, "error: argument --port: must be 1-65535, got -5"),
    (["--triton-grpc-port", "70000"], 2, "error: argument --triton-grpc-port: must be 1-65535, got 70000"),
    (["--host", "no-such-host.invalid"], 2, "error: argument --host: cannot resolve 'no-such-host.invalid'"),
    (["--host", "192.0.2.1"], 1, "error: --host 192.0.2.1 --port "),   # resolves, but not this machine's
    (["--log-dir", "/proc/omni-nope"], 2, "error: --log-dir /proc/omni-nope: cannot create it: No such file"),
    (["--log-dir", "/etc/hostname/logs"], 2, "error: --log-dir /etc/hostname/logs: cannot create it: Not a directory"),
    (["--pipelines", ","], 2, "error: --pipelines names no pipeline (got ','); known: "),
    (["--deploy", "{tmp}/list.yaml"], 2, "error: {tmp}/list.yaml: pipeline: must be one of ['qwen3_omni']"),
    (["--deploy", "{tmp}/binary.yaml"], 2, "error: {tmp}/binary.yaml: cannot read the deploy file: not UTF-8"),
])
def test_launcher_refuses_bad_input_in_one_line_before_starting(tmp_path, case, exit_code, line):
    """The third outside test's launcher values (each was a traceback, or a server with no pipeline): one
    `error:` line naming the flag or file, a non-zero exit, nothing started (no tritonserver log, no /dev/shm
    entry of this launcher). No server starts here: the launcher refuses first."""
    import subprocess
    import sys

    from omni_frontend.tritonserver import SHM_ROOT, shm_name

    (tmp_path / "list.yaml").write_text("pipeline: [qwen3_omni]\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe pipeline: qwen3_omni\n")
    ports = [str(p) for p in free_ports(4)]
    case = [arg.replace("{tmp}", str(tmp_path)) for arg in case]
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_frontend.serve", "--pipelines", "asr", "--no-prepare", "--port", ports[0],
         "--triton-grpc-port", ports[1], "--triton-http-port", ports[2], "--triton-metrics-port", ports[3],
         "--log-dir", str(tmp_path / "log"), *case],   # later flags win
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:   # it started serving (the old `--pipelines ,`): stop it like Ctrl-C
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        pytest.fail(f"{case}: the launcher was still running after 45 s instead of refusing")
    lines = err.strip().splitlines()
    assert proc.returncode == exit_code and len(lines) == 1, err
    assert lines[0].startswith(line.replace("{tmp}", str(tmp_path))) and "Traceback" not in err + out, err
    assert not (tmp_path / "log" / "tritonserver.log").exists()
    assert not list(SHM_ROOT.glob(f"{shm_name(proc.pid, int(ports[1]))}*"))


def test_non_streamed_request_is_cancelled_when_the_client_disconnects(mock_server):
    metrics = mock_server.metrics_url
    before = metric_value(metrics, "omni_requests_total", model="mock_stream", outcome="cancelled") or 0
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "repeat": 1000, "delay_ms": 20}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(f"{mock_server.base_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    assert wait_for(lambda: (metric_value(metrics, "omni_requests_total", model="mock_stream", outcome="cancelled")
                             or 0) > before, 1.5), "the model kept running after the client left"
    assert wait_for(lambda: metric_value(metrics, "omni_inflight_requests", model="mock_stream") == 0, 1.0)


def test_launcher_exits_when_tritonserver_dies(tmp_path):
    server = start_server(tmp_path, *MOCK_ARGS)
    triton = next(p for p in psutil.Process(server.process.pid).children() if p.name() == "tritonserver")
    stubs = stub_processes(triton.pid)
    triton.kill()
    assert server.process.wait(timeout=20) == 1
    assert "tritonserver exited unexpectedly" in server.log()
    assert wait_for(lambda: not [p for p in stubs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], 5.0)


def test_retrieve_one_model(mock_server):
    entry = _client(mock_server).models.retrieve("relay")
    assert entry.id == "relay" and entry.model_extra["triton_models"] == ["mock_stream", "mock_relay"]
    missing = httpx.get(f"{mock_server.base_url}/v1/models/nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("request_id", ["bls-1_1-forged", "bls-forged"])
def test_a_client_request_id_is_never_taken_for_a_bls_child_id(mock_server, request_id):
    """An incoming x-request-id is honoured (echoed, logged) but must not reach Triton as an id the models read as a
    BLS child's (`bls-...`, omni_backends.serving.sidechannel): with `bls-1_1-forged` (a parent process that is
    not there) the model sent its answer and FINAL to nobody and the request hung until the client gave up, and
    with `bls-forged` a model failure went to the side channel only, so the client got a 200 with a cut answer."""
    url = f"{mock_server.base_url}/v1/chat/completions"
    body = {"model": "mock", "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(url, json=body, headers={"x-request-id": request_id}, timeout=10)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "tok0tok1tok2", reply.text
    assert reply.headers["x-request-id"] == request_id
    failed = httpx.post(url, json={**body, "fail_at": 1}, headers={"x-request-id": request_id}, timeout=10)
    assert failed.status_code == 500 and "mock failure at 1" in failed.json()["error"]["message"], failed.text
    assert not (mock_server.sidechannel_dir / f"{request_id}.error").exists()   # nobody would ever take it


@pytest.mark.parametrize("sig, exit_code", [(signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_requests_in_flight_at_the_stop_get_a_503_envelope_or_an_sse_error_event(tmp_path, sig, exit_code):
    """Ctrl-C (or SIGHUP: the terminal closed, which killed the launcher at once, cutting every request without an
    answer and leaving the --tts-engine run copy) with requests in flight: a non-streamed request still running when
    the stop's grace (4.5 s) ends used to be cut by uvicorn with a plain-text `500 Internal Server Error` (no envelope, no x-request-id), a CancelledError
    traceback, and be logged as a client abort (499); an SSE stream was cut without an event. Now the first gets a
    503 envelope (`server_shutting_down`, Retry-After, its x-request-id), logged as 503; the stream ends at once with
    an error event; the stop takes no longer than the grace."""
    server = start_server(tmp_path, *MOCK_ARGS)
    url = f"{server.base_url}/v1/chat/completions"
    body = {"model": "relay", "messages": [{"role": "user", "content": "hi"}], "repeat": 200, "delay_ms": 100}
    stream_lines: list[str] = []

    def streamed():
        with httpx.stream("POST", url, json={**body, "stream": True}, headers={"x-request-id": "stop-stream"},
                          timeout=60) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                stream_lines.append(line)

    try:
        with ThreadPoolExecutor(2) as pool:
            plain = pool.submit(httpx.post, url, json=body, headers={"x-request-id": "stop-plain"}, timeout=60)
            stream = pool.submit(streamed)
            assert wait_for(lambda: metric_value(server.metrics_url, "omni_inflight_requests", model="mock_relay") == 2,
                            30)
            assert wait_for(lambda: len(stream_lines) > 2, 30)
            stopped = time.monotonic()
            server.process.send_signal(sig)
            answer = plain.result(timeout=60)
            answered_s = time.monotonic() - stopped
            stream.result(timeout=60)
        assert server.process.wait(timeout=60) == exit_code
    finally:
        server.stop()
    assert server.shm_entries() == []
    assert answer.status_code == 503, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"error": {"message": "the server is shutting down; retry the request",
                                       "type": "service_unavailable", "param": None, "code": "server_shutting_down"}}
    assert answer.headers["retry-after"] == "5" and answer.headers["x-request-id"] == "stop-plain"
    assert 3.5 < answered_s < 10, answered_s   # after the grace, well before uvicorn's own cancel would have cut it
    events = [json.loads(line[6:]) for line in stream_lines if line.startswith("data: {")]
    assert events[-1] == {"error": {"message": "the server is shutting down; retry the request",
                                    "type": "service_unavailable", "param": None, "code": "server_shutting_down"}}
    assert len(events) < 100   # ended at the stop, not after its 200 deltas
    log = server.log()
    assert "POST /v1/chat/completions -> 503" in log and "request_id=stop-plain (cut by the server's stop)" in log
    assert "request_id=stop-stream (cut by the server's stop)" in log
    assert "-> 499" not in log and "Traceback" not in log and "Exception in ASGI application" not in log
    assert "ASGI callable returned without completing response" not in log
