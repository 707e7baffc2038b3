"""An incoming `x-request-id` that looks like a BLS child id (`bls-<digits>_<digits>-...`) makes the request
hang: no answer ever comes (the client waits until its own timeout, then the frontend logs a 499), and the
Triton request stays open inside tritonserver for good, so `POST /v1/admin/pipelines/voice/sleep` answers
after 60 s with `pending: ["voice", ...]` (its stubs keep running) and a clean stop of the server sits out
tritonserver's whole exit timeout (33.9 s against 8.3 s without such a request, same server). The same holds
for a realtime session opened with that header (the session's Triton ids are `<x-request-id>-<response id>`):
`response.create` gets `response.created` and then nothing (no `response.done` within 20 s).

Wrong: the frontend passes the client's `x-request-id` as the Triton request id (frontend/pipeline_stream.py ->
triton_client.stream(request_id=...)), and the backends decide "is this a BLS child?" from the id alone
(python_backends/serving/sidechannel.py: `_SAFE` / `_OWNER`, `is_child`, `owner_gone`): `bls-1_1-x` names
"parent pid 1, start time 1", which is not running, so `decoupled.send_response` / `send_final` send nothing
to the "dead parent" and the client's request is never answered (and `stop_requested` never asks Triton's
`is_cancelled()` for it, so a real client disconnect is not seen either).
Expected (README "Operations": "Every response carries `x-request-id` (an incoming one is honoured)"): any
value of the header is an opaque correlation id echoed back; it must not change how the request is served.
The request is answered (200) like the same request without the header, e.g. by giving the Triton request
its own id (and logging the client's id beside it), or by never treating a client-facing request as a child.
Reproduce: POST /v1/chat/completions (voice, max_tokens 8) with `x-request-id: bls-1_1-probe`.
Exit 1 while the request gets no answer within 30 s, 0 when it is answered.
"""
import json, os, sys, time, urllib.error, urllib.request

BASE = os.environ.get("BASE_URL", "http://127.0.0.1:23000").rstrip("/")
body = json.dumps({"model": "voice", "modalities": ["text"], "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Say hi."}]}).encode()


def chat(request_id):
    headers = {"content-type": "application/json"}
    if request_id:
        headers["x-request-id"] = request_id
    req = urllib.request.Request(BASE + "/v1/chat/completions", body, headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, time.monotonic() - started
    except urllib.error.HTTPError as e:
        return e.code, time.monotonic() - started
    except (TimeoutError, OSError) as e:
        return f"no answer ({type(e).__name__})", time.monotonic() - started


status, took = chat(None)
print(f"without x-request-id: {status} in {took:.1f} s")
status, took = chat("bls-1_1-probe")
print(f"x-request-id bls-1_1-probe: {status} after {took:.1f} s")
if status != 200:
    print("FAULT: a request whose x-request-id looks like a BLS child id is never answered (expected 200)")
    sys.exit(1)
print("ok: answered")
sys.exit(0)
