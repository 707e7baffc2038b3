"""Server A (Triton-native, and the frontend). `qwen3_omni` takes the `voice` pipeline's extension field
`first_chunk_words` and drops it silently, where the docs say it does not read it and so refuses it.

docs/pipelines.md "Chat with text and speech": "Unknown fields (the SDK's `extra_body`) reach the pipeline if it
reads them; the route refuses any other with a 400 `unsupported_parameter` naming the field ... (the fields each
pipeline reads are its answer to REQUEST `{"action": "fields"}`, asked once; the pipeline refuses them too, for
direct Triton clients): `qwen3_omni` reads `talker_*`, `min_tokens` and `return_token_ids`; `voice` reads
`first_chunk_words`; neither reads the other's." docs/reliability.md "Fields that would change the answer": "It is
never silently dropped."
Actual: `qwen3_omni` lists `first_chunk_words` in its {"action": "fields"} answer (turn.REQUEST_FIELDS: "accepted and
has no effect") and serves a REQUEST carrying `first_chunk_words: 2` (and so does POST /v1/chat/completions with
model qwen3_omni), while `voice` refuses `talker_top_k` as the docs say (400 naming it).
Right: as documented, a 400 `unsupported_parameter` naming `first_chunk_words` (not in the fields answer), or the
docs name it among what qwen3_omni takes.

Exits 1 while qwen3_omni lists/accepts first_chunk_words, 0 when it refuses it naming the field.
"""
import json
import os
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient

URL = os.environ.get("TRITON_URL", "127.0.0.1:25001")


def ask(model: str, body: dict):
    """(events, errors) of one streamed request."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(URL)
    request = grpcclient.InferInput("REQUEST", [1], "BYTES")
    request.set_data_from_numpy(np.array([json.dumps(body).encode()], dtype=np.object_))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(model, [request], enable_empty_final_response=True)
    found, errors = [], []
    try:
        while True:
            result, error = answers.get(timeout=120)
            if error is not None:
                errors.append(str(error))
                break   # an error response carries FINAL
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            found.append(json.loads(result.as_numpy("EVENT").reshape(-1)[0]))
    finally:
        client.stop_stream()
        client.close()
    return found, errors


def main() -> int:
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "modalities": ["text"]}
    control = ask("voice", {**chat, "talker_top_k": 2})
    print("voice with talker_top_k:", control[0][:1], [e[:160] for e in control[1]])
    if not control[1] or "talker_top_k" not in control[1][0]:
        print("voice did not refuse qwen3_omni's field either: inconclusive")
        return 2
    fields = ask("qwen3_omni", {"action": "fields"})[0][0]["fields"]
    print("qwen3_omni fields:", fields)
    answer = ask("qwen3_omni", {**chat, "first_chunk_words": 2})
    print("qwen3_omni with first_chunk_words: events", [e.get("type") for e in answer[0]], "errors",
          [e[:200] for e in answer[1]])
    refused = bool(answer[1]) and "first_chunk_words" in answer[1][0] and "unsupported_parameter" in answer[1][0]
    faults = []
    if "first_chunk_words" in fields:
        faults.append("qwen3_omni's {\"action\": \"fields\"} lists first_chunk_words (the voice pipeline's field)")
    if not refused:
        faults.append("qwen3_omni served a REQUEST with first_chunk_words and dropped the field; the docs say it does "
                      "not read it: a 400 unsupported_parameter naming it")
    for fault in faults:
        print("FAULT:", fault)
    return 1 if faults else 0


sys.exit(main())
