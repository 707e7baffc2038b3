"""qwen3_omni_thinker: the Qwen3-Omni thinker as an engine stage (decoupled, continuous batching).

Tensors: see `omni_backends.qwen3_omni.serving.protocol`. Sampling from the REQUEST JSON: temperature
(0 or null: greedy), top_p, top_k (-1/0: off), max_tokens (null: config `max_tokens`, default 256),
seed, presence_penalty, frequency_penalty, repetition_penalty, stop (strings; the text is cut there
and the turn ends with finish_reason "stop"). The turn
also ends at `<|im_end|>` (included in completion_tokens, never in the text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer, WhisperFeatureExtractor

from omni_backends.engine import StepOutput, TextStream
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.loading import load_config, load_thinker
from omni_backends.qwen3_omni.prompt import ThinkerInputs
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.qwen3_omni.thinker import Thinker
from omni_backends.chat_request import audio_clips, text_chars
from omni_backends.engine.limits import check_context_length, check_prompt_chars, longest_token_chars
from omni_backends.engine.sampling import request_sampling_params
from omni_backends.serving import events, model_config
from omni_backends.serving.engine_model import EngineStageModel


@dataclass
class _Turn:
    inputs: ThinkerInputs
    text: TextStream
    talker_inputs: bool


class TritonPythonModel(EngineStageModel):
    def build_loop(self, args):
        path = p.stage_checkpoint(self.parameters, self.model_name)
        config = load_config(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        self.thinker = Thinker(load_thinker(path, config), config, tokenizer, WhisperFeatureExtractor.from_pretrained(path),
                               max_running=model_config.int_parameter(self.parameters, "max_running", 32),
                               max_prefill_tokens=model_config.int_parameter(self.parameters, "max_prefill_tokens", 512))
        self.defaults = self.thinker.sampling_params(
            max_tokens=model_config.int_parameter(self.parameters, "max_tokens", 256), temperature=0.0)
        self.context_length = config.thinker_config.text_config.max_position_embeddings
        self.longest_token = longest_token_chars(tokenizer)
        return self.thinker.loop

    def make_prompt(self, request):
        body = events.decode_request(pb_utils.get_input_tensor_by_name(request, p.REQUEST).as_numpy())
        audio = pb_utils.get_input_tensor_by_name(request, p.INPUT_AUDIO)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        params = request_sampling_params(body, self.defaults)
        check_prompt_chars(text_chars(messages), params.max_tokens, self.context_length, self.longest_token)
        inputs = self.thinker.prompts.build(messages, audio_clips(messages, None if audio is None else audio.as_numpy()))
        check_context_length(len(inputs.input_ids), params.max_tokens, self.context_length)
        stop = body.get("stop") or []
        turn = _Turn(inputs, TextStream(self.thinker.prompts.tokenizer, len(inputs.input_ids),
                                        [stop] if isinstance(stop, str) else stop),
                     bool(body.get("talker_inputs", True)))
        return self.thinker.engine_prompt(inputs), params, turn

    def finished(self, turn: _Turn) -> bool:
        return turn.text.finished  # a stop string ended the turn before the engine did

    def encode(self, turn: _Turn, output: StepOutput):
        delta = turn.text.step(output)
        event = {"type": "token", "token_id": output.token_id, "index": output.index,
                 "text": delta.text if delta else ""}
        if delta is not None and delta.finished:
            event.update(type="done", finish_reason=delta.finish_reason,
                         usage={"prompt_tokens": delta.usage.prompt_tokens,
                                "completion_tokens": delta.usage.completion_tokens})
        tensors = {p.EVENT: events.json_tensor(event)}
        if not turn.talker_inputs:
            return tensors
        token = self.thinker.token(turn.inputs.input_ids, output)
        if token.embed is not None:
            tensors[p.EMBED] = token.embed.float().cpu().numpy()
        if token.talker_prompt is not None:
            prompt = token.talker_prompt
            tensors.update({p.PROMPT_IDS: prompt.prompt_ids.numpy().astype(np.int64),
                            p.PROMPT_EMBEDS: prompt.prompt_embeds.float().cpu().numpy(),
                            p.MM_HIDDEN: prompt.mm_hidden.float().cpu().numpy()})
        return tensors
