"""Server A (Triton-native). voice_vad is sequence-batched (`oldest`, max_candidate_sequences 1024,
max_sequence_idle_microseconds 3600 s). A Triton client that STARTs sequences and never sends END (a client that
crashed, a load test, a leaking frontend) fills the 1024 slots; from then on every NEW sequence (a new realtime
session's VAD, another client's session) gets no answer at all: its request waits in Triton's backlog until an old
sequence idles out, an hour later. No error, /health stays 200, omni_inflight_requests{model="voice_vad"} shows 0
while nv_inference_pending_request_count grows.

Steps: START ~1030 sequences with 0 samples each and no END (tritonclient gRPC, `sequence_start=True`); then START
one more sequence with a 10 s client timeout. Cleanup: END every sequence opened.
Expected: a fresh sequence is served (or refused at once with a clear error, e.g. a 429-like "too many live
sequences"); abandoned sequences should not lock the VAD for an hour (docs/pipelines.md "Driving the Triton models
directly"; the brief's "many concurrent sequences").
Actual: DEADLINE_EXCEEDED for every sequence past the ~1024th and for the fresh one; the realtime route's VAD feeds
hang the same way (nv_inference_pending_request_count{model="voice_vad"} counts them).
"""
import os, sys, time
import numpy as np
import tritonclient.grpc as grpcclient

GRPC = os.environ.get("TRITON_GRPC_URL", "127.0.0.1:" + os.environ.get("TRITON_GRPC_PORT", "21001"))
BASE = 987_000_000


def feed(client, corrid, start=False, end=False, timeout=10):
    audio = grpcclient.InferInput("AUDIO", [1, 0], "FP32")
    audio.set_data_from_numpy(np.zeros((1, 0), np.float32))
    client.infer("voice_vad", [audio], sequence_id=corrid, sequence_start=start, sequence_end=end,
                 client_timeout=timeout)


def main() -> int:
    client = grpcclient.InferenceServerClient(GRPC)
    opened, refused = [], None
    try:
        for i in range(1030):
            try:
                feed(client, BASE + i, start=True, timeout=5)
                opened.append(BASE + i)
            except Exception as exc:  # noqa: BLE001
                refused = (i, str(exc)[:200])
                break
        print(f"opened {len(opened)} sequences without END; first failure: {refused}")
        t = time.time()
        try:
            feed(client, BASE + 5000, start=True, end=True, timeout=10)
            fresh = None
        except Exception as exc:  # noqa: BLE001
            fresh = f"{str(exc)[:200]} after {time.time() - t:.1f} s"
        print("fresh sequence:", fresh or "served")
    finally:
        if refused is not None:
            opened.append(BASE + refused[0])   # its START waited in the backlog and runs once slots free
        for corrid in opened:
            try:
                feed(client, corrid, end=True, timeout=5)
            except Exception:  # noqa: BLE001
                pass
        client.close()
    if fresh and "DEADLINE" in fresh.upper():
        print("FAULT: with ~1024 sequences left open, a new voice_vad sequence hangs (no error) until the 1 h idle "
              "timeout")
        return 1
    return 0


sys.exit(main())
