"""Server A (Triton-native). The chat pipeline `qwen3_omni` refuses the documented control action
REQUEST {"action": "prompt_tokens"} as an unknown field, where `voice` answers it.

The client-facing tensor protocol (docs/architecture.md "The client-facing tensor protocol
(`omni_backends.serving.events`)"; its module doc, python_backends/serving/events.py) says:
  "REQUEST {"action": "prompt_tokens", "messages", "max_tokens"} to a chat pipeline -> one {"type": "prompt_tokens",
   "prompt_tokens": int, "context_length": int}, or its 400 `context_length_exceeded` when the messages plus
   max_tokens cannot fit its context"
and docs/pipelines.md "Chat with text and speech (`voice`, `qwen3_omni`)" names both chat pipelines. `voice` answers
{"type": "prompt_tokens", "prompt_tokens": 10, "context_length": 8192}; `qwen3_omni` (control_actions ("voices",)
only, python_backends/qwen3_omni/serving/omni_model.py) answers a 400 `unsupported_parameter`
"action is not a request field of model qwen3_omni (its fields: ...)", so a Triton client cannot ask it how many
tokens a prompt takes or whether it fits the thinker's context before sending it.
Right: one prompt_tokens event (its thinker's tokenizer and context), or a 400 context_length_exceeded; or the
protocol documents the action for `voice` only.

Exits 1 while qwen3_omni refuses the action, 0 when it answers it as `voice` does.
"""
import json
import os
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient

URL = os.environ.get("TRITON_URL", "127.0.0.1:25001")
BODY = {"action": "prompt_tokens", "messages": [{"role": "system", "content": "You are brief."},
                                                {"role": "user", "content": "Hi"}], "max_tokens": 16}


def ask(model: str):
    """(events, errors) of one streamed request."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(URL)
    request = grpcclient.InferInput("REQUEST", [1], "BYTES")
    request.set_data_from_numpy(np.array([json.dumps(BODY).encode()], dtype=np.object_))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(model, [request], enable_empty_final_response=True)
    found, errors = [], []
    try:
        while True:
            result, error = answers.get(timeout=60)
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
    voice = ask("voice")
    print("voice:", voice)
    if not voice[0] or voice[0][0].get("type") != "prompt_tokens":
        print("voice did not answer the action either: inconclusive")
        return 2
    omni = ask("qwen3_omni")
    print("qwen3_omni:", omni[0], [e[:300] for e in omni[1]])
    answered = omni[0] and omni[0][0].get("type") == "prompt_tokens" and \
        isinstance(omni[0][0].get("prompt_tokens"), int) and isinstance(omni[0][0].get("context_length"), int)
    if not answered:
        print("FAULT: qwen3_omni, a chat pipeline, does not answer REQUEST {\"action\": \"prompt_tokens\"} "
              "(the protocol of omni_backends.serving.events): expected one prompt_tokens event")
        return 1
    return 0


sys.exit(main())
