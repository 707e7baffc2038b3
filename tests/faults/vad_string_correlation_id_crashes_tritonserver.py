"""Server A (Triton-native). A string correlation id sent to `voice_vad` corrupts tritonserver's heap and takes the
whole server down (every pipeline); string ids of one length sharing their first 4 characters share one VAD state.

docs/pipelines.md "Driving the Triton models directly": "`voice_vad` is sequence-batched (strategy `oldest`): send
each session's audio with one correlation id, `START` on the first request and `END` on the last (`tritonclient`
`sequence_id=`, ...)". `tritonclient`'s `sequence_id` takes an int or a str, and Triton's sequence batcher accepts
string correlation ids (it keeps "session-aaaa" and "session-bbbb" as two sequences, in two slots). But the model's
config declares its CORRID control `data_type: TYPE_UINT64` (model_repository/voice_vad/config.pbtxt; the same in
qwen3_omni_talker / qwen3_omni_code2wav) and `vad_model.py` keys its per-session state by that CORRID value:
Triton 2.51 writes the string as a serialized BYTES element (a 4-byte length, then the characters) into the
8-byte CORRID tensor (the model saw "session-aaaa" as 8319104481279082508 = b"\x0c\x00\x00\x00sess"), so
  - two sequences whose ids have the same length and first 4 characters ("session-aaaa", "session-bbbb") get ONE
    state: the second's START replaces the first's, and a request of a live sequence is refused
    `sequence_not_started` (or gets another session's events);
  - an id longer than 4 characters writes past the tensor's 8 bytes; with the 12- and 40-character ids below
    tritonserver aborts moments later (3 of 3 runs)
    ("free(): invalid next size (fast)", Signal (6)) and the launcher exits ("tritonserver exited unexpectedly
    with code -6"): one direct client kills every pipeline (the third outside test fixed the same kind of abort,
    a huge HTTP shape, by closing the HTTP port). qwen3_omni_talker / qwen3_omni_code2wav declare the same CORRID.
Right: a string correlation id is either served as its own sequence (CORRID control TYPE_STRING, or the model
keyed by `request.correlation_id()`), or refused with an error; the server never dies from one request.

Steps: (0) the control with int ids; (1) "session-aaaa": START with a whole turn (silence, speech, silence); START
"session-bbbb"; "session-aaaa": silence + speech: its events (sample offsets) must equal those of the control; END
both. (2) START+END 8 sequences with 40-byte string ids. (3) wait 10 s: Triton must still be live. Exits 1 while either is wrong. NOTE: while the fault is present this kills server A
(restart it afterwards).
"""
import json
import os
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient

URL = os.environ.get("TRITON_URL", "127.0.0.1:25001")
SR = 16000


def tts_speech(client) -> np.ndarray:
    """A spoken sentence from server A's `tts` model (24 kHz), resampled to the VAD's 16 kHz."""
    import queue
    answers = queue.Queue()
    request = grpcclient.InferInput("REQUEST", [1], "BYTES")
    request.set_data_from_numpy(np.array([json.dumps({"input": "The quick brown fox jumps over the lazy dog.",
                                                      "voice": "alloy"}).encode()], dtype=np.object_))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("tts", [request], enable_empty_final_response=True)
    pcm = []
    while True:
        result, error = answers.get(timeout=120)
        if error is not None:
            raise RuntimeError(f"tts: {error}")
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
        pcm.append(result.as_numpy("AUDIO").reshape(-1))
    client.stop_stream()
    audio = np.concatenate(pcm)
    n = int(len(audio) * SR / 24000)
    return np.interp(np.linspace(0, len(audio) - 1, n), np.arange(len(audio)), audio).astype(np.float32)


def vad(client, corrid, audio, start=False, end=False):
    tensor = grpcclient.InferInput("AUDIO", [1, len(audio)], "FP32")
    tensor.set_data_from_numpy(np.asarray(audio, np.float32)[None])
    result = client.infer("voice_vad", [tensor], sequence_id=corrid, sequence_start=start, sequence_end=end,
                          client_timeout=20)
    return json.loads(result.as_numpy("EVENTS").reshape(-1)[0])


def live(client) -> bool:
    try:
        return client.is_server_live(client_timeout=3)
    except Exception:  # noqa: BLE001
        return False


def main() -> int:
    client = grpcclient.InferenceServerClient(URL)
    if not live(client):
        print(f"Triton at {URL} is not live: start server A first")
        return 2
    silence = np.zeros(SR, np.float32)
    speech = tts_speech(client)
    faults = []

    def scenario(a, b):
        """A: 1 s silence, speech, 1 s silence (a whole turn); B STARTs; A: 1 s silence, speech. The events of A's
        second request carry sample offsets counted from A's first sample."""
        vad(client, a, np.concatenate([silence, speech, silence]), start=True)
        vad(client, b, silence, start=True)
        found = vad(client, a, np.concatenate([silence, speech]))
        vad(client, a, silence, end=True)
        vad(client, b, silence, end=True)
        return found

    control = scenario(7_700_001, 7_700_002)   # int ids: the documented behaviour
    print("int ids 7700001 / 7700002, A's second request:", control)
    if not any(e["type"] == "speech_started" for e in control):
        print("the control with int ids did not detect the test speech: inconclusive")
        return 2

    # (1) two string ids sharing their first 8 bytes
    a, b = "session-aaaa", "session-bbbb"
    try:
        found = scenario(a, b)
        print(f"string ids {a!r} / {b!r}, A's second request:", found)
        if found != control:
            faults.append(f"sequence {a!r} lost its state when {b!r} STARTed: its events {found} differ from the "
                          f"same requests with int ids {control} (offsets restarted from {b!r}'s START)")
    except Exception as exc:  # noqa: BLE001
        print(f"string ids {a!r} / {b!r}: {str(exc)[:300]}")
        if "sequence_not_started" in str(exc):
            faults.append(f"a request of the live sequence {a!r} or {b!r} (both STARTed, neither ENDed) was refused "
                          "as 'not started': the model does not know the sequence by the id Triton routes it by")

    # (2) longer string ids
    for i in range(8):
        try:
            vad(client, f"realtime-session-{i:04d}-0123456789abcdef", silence, start=True, end=True)
        except Exception as exc:  # noqa: BLE001
            print(f"40-byte string id {i}: {str(exc)[:200]}")
            break

    # (3) is the server still there?
    deadline = time.time() + 10
    alive = True
    while time.time() < deadline:
        if not live(client):
            alive = False
            break
        time.sleep(0.5)
    print("Triton live 10 s after the string ids:", alive)
    if not alive:
        faults.append("tritonserver died after requests with string correlation ids longer than 8 bytes "
                      "(server log: 'free(): invalid next size (fast)', Signal (6))")
    client.close()
    for fault in faults:
        print("FAULT:", fault)
    return 1 if faults else 0


sys.exit(main())
