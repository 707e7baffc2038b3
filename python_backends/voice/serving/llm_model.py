"""voice_llm: SmolLM2-135M-Instruct chat, an engine stage (decoupled, continuous batching).

Contract (internal stage of the `voice` pipeline; any Triton gRPC streaming client can drive it):
  REQUEST BYTES [1]  JSON {"messages": [{"role", "content": str}] | "prompt": str | [token id] (a completion: no
                     chat template), "temperature", "top_p", "top_k",
                     "max_tokens", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "stop": [str]} (null/missing sampling fields: greedy, 256 tokens); or the control REQUEST
                     {"action": "prompt_tokens", "messages", "max_tokens"}: one event
                     {"type": "prompt_tokens", "prompt_tokens", "context_length"} (the chat template's token count),
                     or the 400 `context_length_exceeded` the same messages and max_tokens would get; it and
                     {"action": "detokenize", "tokens"} as omni_backends.serving.token_actions describes
  EVENT   BYTES [1]  per response: {"type": "text.delta", "text", "usage"} (the counts so far); the last one
                     {"type": "done", "text" (the held-back tail, often ""), "finish_reason", "usage":
                     {"prompt_tokens", "completion_tokens"}}, then FINAL
"""
from __future__ import annotations


import triton_python_backend_utils as pb_utils

from omni_backends.chat_request import check_request
from omni_backends.serving import events, model_config, token_actions
from omni_backends.serving.engine_model import EngineStageModel
from omni_backends.engine import TextStream
from omni_backends.voice.llm import ChatLLM
from omni_backends.paths import resolve_checkpoint


class TritonPythonModel(EngineStageModel):
    def build_loop(self, args):
        self.chat = ChatLLM(resolve_checkpoint(self.parameters["checkpoint"], self.model_name),
                            threads=model_config.int_parameter(self.parameters, "threads", 0) or None,
                            max_running=model_config.int_parameter(self.parameters, "max_running", 8),
                            prefill_chunk=model_config.int_parameter(self.parameters, "prefill_chunk", 128))
        return self.chat.engine

    def make_prompt(self, request):
        body = events.decode_request(pb_utils.get_input_tensor_by_name(request, events.REQUEST).as_numpy())
        chat = self.chat
        control = body.get("action") in token_actions.ACTIONS
        if not control:
            check_request(body, parts=False)  # a field of the wrong JSON type: a 400 naming it
        params = chat.sampling_params(body)
        if control:
            event = token_actions.answer(body, chat.tokenizer, chat.template_text, params.max_tokens,
                                         chat.context_length, chat.longest_token)
            return {events.EVENT: events.json_tensor(event)}
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if body.get("prompt") is not None:   # a completion: the raw prompt, no chat template
            ids = token_actions.completion_ids(chat.tokenizer, body["prompt"], params.max_tokens, chat.context_length,
                                               chat.longest_token)
            return chat.prepare_ids(ids, params, stop, (len(ids),))
        return chat.prepare(body["messages"], params, stop)

    def finished(self, stream: TextStream) -> bool:
        return stream.finished  # a stop string ended the answer before the engine did

    def encode(self, stream: TextStream, output):
        delta = stream.step(output)
        if delta is None:
            return None
        usage = {"prompt_tokens": delta.usage.prompt_tokens, "completion_tokens": delta.usage.completion_tokens}
        if not delta.finished:
            event = {"type": "text.delta", "text": delta.text, "usage": usage}
        else:
            event = {"type": "done", "text": delta.text, "finish_reason": delta.finish_reason, "usage": usage}
        return {events.EVENT: events.json_tensor(event)}
