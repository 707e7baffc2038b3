"""qwen3_omni_thinker: the Qwen3-Omni thinker as an engine stage (decoupled, continuous batching).

Tensors: see `omni_backends.qwen3_omni.serving.protocol`. Sampling from the REQUEST JSON: temperature
(0 or null: greedy), top_p, top_k (-1/0: off), max_tokens (null: config `max_tokens`, default 256),
min_tokens (vLLM's extension: `<|im_end|>` is suppressed before that many tokens), seed, stop
(strings; the text is cut there and the turn ends with finish_reason "stop"). Stage settings:
`protocol.stage_setup` (device from the instance kind, dtype, engine, kernels, gpu_tensors). The turn
also ends at `<|im_end|>` (included in completion_tokens, never in the text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer, WhisperFeatureExtractor

from omni_backends.engine import SamplingParams, StepOutput, TextStream
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.loading import load_config, load_thinker
from omni_backends.qwen3_omni.prompt import ThinkerInputs
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.qwen3_omni.thinker import Thinker
from omni_backends.chat_request import audio_clips
from omni_backends.engine.sampling import check_context_length
from omni_backends.serving import events, model_config
from omni_backends.serving.engine_model import EngineStageModel


@dataclass
class _Turn:
    inputs: ThinkerInputs
    text: TextStream
    talker_inputs: bool


class TritonPythonModel(EngineStageModel):
    def build_loop(self, args):
        setup = p.stage_setup(args, self.parameters, self.model_name)
        config = load_config(setup.path)
        self.thinker = Thinker(load_thinker(setup.path, config, setup.device, setup.dtype), config,
                               AutoTokenizer.from_pretrained(setup.path),
                               WhisperFeatureExtractor.from_pretrained(setup.path),
                               max_running=model_config.int_parameter(self.parameters, "max_running", 32),
                               options=setup.options)
        self.thinker.warmup()
        self.gpu_tensors = setup.gpu_tensors
        self.default_max_tokens = model_config.int_parameter(self.parameters, "max_tokens", 256)
        return self.thinker.loop

    def make_prompt(self, request):
        body = events.decode_request(pb_utils.get_input_tensor_by_name(request, p.REQUEST).as_numpy())
        audio = pb_utils.get_input_tensor_by_name(request, p.INPUT_AUDIO)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        inputs = self.thinker.prompts.build(messages, audio_clips(messages, None if audio is None else audio.as_numpy()))
        stop = body.get("stop") or []
        turn = _Turn(inputs, TextStream(self.thinker.prompts.tokenizer, len(inputs.input_ids),
                                        [stop] if isinstance(stop, str) else stop),
                     bool(body.get("talker_inputs", True)))
        params = self.sampling_params(body)
        check_context_length(len(inputs.input_ids), params.max_tokens, self.thinker.context_length)
        return self.thinker.engine_prompt(inputs), params, turn

    def sampling_params(self, body: dict) -> SamplingParams:
        """Thinker SamplingParams from the REQUEST fields. Raises RequestError naming a bad field."""
        temperature = body.get("temperature")
        values = {"max_tokens": body.get("max_tokens") or self.default_max_tokens,
                  "temperature": 0.0 if temperature is None else temperature,
                  "top_p": body.get("top_p") or 1.0, "top_k": max(int(body.get("top_k") or 0), 0),
                  "seed": body.get("seed"), "min_tokens": body.get("min_tokens") or 0}
        try:
            return self.thinker.sampling_params(**values)
        except (TypeError, ValueError) as exc:
            raise RequestError(f"invalid sampling parameter: {exc}",
                               param=next((k for k in values if k in str(exc)), None)) from None

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
            tensors[p.EMBED] = self._hidden(token.embed)
            self.metrics.tensor(p.EMBED, "out", self.gpu_tensors)
        if token.talker_prompt is not None:
            prompt = token.talker_prompt
            tensors.update({p.PROMPT_IDS: prompt.prompt_ids.numpy().astype(np.int64),
                            p.PROMPT_EMBEDS: self._hidden(prompt.prompt_embeds),
                            p.MM_HIDDEN: self._hidden(prompt.mm_hidden)})
        return tensors

    def _hidden(self, tensor):
        """FP32 hidden states for the talker: a CUDA tensor (DLPack, no host copy) or a numpy copy (always
        for an empty tensor: it has no device memory to share)."""
        tensor = tensor.float()
        return tensor.contiguous() if self.gpu_tensors and tensor.numel() else tensor.cpu().numpy()
