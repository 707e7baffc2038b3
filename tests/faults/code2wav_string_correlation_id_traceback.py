"""Server A (Triton-native). A request to `qwen3_omni_code2wav` with a (short) string correlation id is answered
with a Python traceback (ValueError from `int(request.correlation_id())`), not an error envelope; a numeric string
id ("12") is silently taken as the int id 12 (another caller's sequence).

docs/pipelines.md "Driving the Triton models directly" documents `qwen3_omni_code2wav` for direct clients
("sequences of `CODES` INT64 [1, 16, frames] with `START` / `END` / optional `ABORT`, PCM out"), and
docs/architecture.md "The client-facing tensor protocol": "The models check what a direct client may send before
they use it" (the third outside test fixed Python exceptions answered to direct clients "for the whole kind").
Triton accepts string correlation ids (`tritonclient` `sequence_id="ab"`), but code2wav_model.py `_execute` runs
`seq = int(request.correlation_id())` outside any check: the request gets
"Failed to process the request(s) for model 'qwen3_omni_code2wav_0_0', message: ValueError: invalid literal for
int() with base 10: 'ab' At: .../code2wav_model.py(92): _execute ...". Since the exception leaves `execute`,
Triton fails EVERY request of that batch: the oldest strategy batches the turns of all callers, so another
client's chat fails too (seen: 3 threads sending string-id START/END to code2wav while 6 qwen3_omni chats with speech
ran one after another; the 6th ended with "qwen3_omni: StageError: qwen3_omni_code2wav: ... ValueError: invalid
literal for int() with base 10: 'ef'"). talker_model.py `_parse` has the same `int(...)`.
(The unclean stop seen later on that server happens after any qwen3_omni chats:
qwen3_omni_stop_sits_out_exit_timeout.py.)
(Ids longer than 4 characters also overflow the CORRID control tensor and abort tritonserver:
vad_string_correlation_id_crashes_tritonserver.py; this script keeps to 2-character ids, which do not.)
Right: a string correlation id is refused with a 400 envelope naming it (or served as its own sequence), never a
traceback, never another sequence's state.

Exits 1 while the answer is a traceback, 0 otherwise.
"""
import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient

URL = os.environ.get("TRITON_URL", "127.0.0.1:25001")


def call(client, corrid, start=False, end=False):
    codes = grpcclient.InferInput("CODES", [1, 16, 0], "INT64")
    codes.set_data_from_numpy(np.zeros((1, 16, 0), np.int64))
    try:
        result = client.infer("qwen3_omni_code2wav", [codes], sequence_id=corrid, sequence_start=start,
                              sequence_end=end, client_timeout=30)
        return f"ok, PCM {result.as_numpy('PCM').shape}"
    except Exception as exc:  # noqa: BLE001
        return f"error: {exc}"


def main() -> int:
    client = grpcclient.InferenceServerClient(URL)
    control = call(client, 8_800_001, start=True)
    call(client, 8_800_001, end=True)
    print("int id 8800001 START:", control)
    if not control.startswith("ok"):
        print("the control with an int id failed: inconclusive")
        return 2
    answer = call(client, "ab", start=True)
    call(client, "ab", end=True)
    print("string id 'ab' START:", answer[:400])
    client.close()
    if "ValueError" in answer or "At:" in answer or "Traceback" in answer:
        print("FAULT: a string correlation id is answered with a Python traceback (ValueError in _execute), not "
              "an error envelope")
        return 1
    return 0


sys.exit(main())
