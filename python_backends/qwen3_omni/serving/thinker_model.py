"""qwen3_omni_thinker: the Qwen3-Omni thinker as an engine stage (decoupled, continuous batching); takes text,
audio (INPUT_AUDIO) and images (INPUT_IMAGES + INPUT_IMAGE_SIZES).

Tensors: see `omni_backends.qwen3_omni.serving.protocol`. Sampling from the REQUEST JSON
(`turn.thinker_request`): temperature, top_p, top_k, max_tokens (null: config `max_tokens`, default 256),
min_tokens, seed, stop (strings; the text is cut there and the turn ends with finish_reason "stop"); `prompt` instead of
`messages`: a completion's raw prompt. The token control REQUESTs (`token_actions`: {"action": "prompt_tokens"},
{"action": "detokenize"}) are answered with one EVENT from the thinker's tokenizer. Stage settings:
`protocol.stage_setup` (device from the instance kind, dtype, engine, kernels, gpu_tensors). The turn
also ends at `<|im_end|>` (included in completion_tokens, never in the text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer, WhisperFeatureExtractor

from omni_backends.chat_request import check_request
from omni_backends.engine import StepOutput, TextStream
from omni_backends.qwen3_omni.loading import load_config, load_image_processor, load_thinker
from omni_backends.qwen3_omni.prompt import ThinkerInputs
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.qwen3_omni.serving import turn as turns
from omni_backends.qwen3_omni.thinker import Thinker
from omni_backends.serving import events, model_config, token_actions
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
                               options=setup.options, image_processor=load_image_processor(setup.path))
        self.thinker.warmup()
        self.gpu_tensors = setup.gpu_tensors
        self.default_max_tokens = model_config.int_parameter(self.parameters, "max_tokens", 256)
        return self.thinker.loop

    def make_prompt(self, request):
        body = events.decode_request(pb_utils.get_input_tensor_by_name(request, p.REQUEST).as_numpy())
        if body.get("action") in token_actions.ACTIONS:
            return {p.EVENT: events.json_tensor(turns.token_action(self.thinker, body, self.default_max_tokens))}
        check_request(body, images=True)  # any field of the wrong JSON type: a 400 naming it, before it is used

        def read(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        inputs, params, text = turns.thinker_request(self.thinker, body, turns.media_inputs(read),
                                                    self.default_max_tokens)
        context = _Turn(inputs, text, bool(body.get("talker_inputs", True)))
        return self.thinker.engine_prompt(inputs), params, context

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
        token = self.thinker.token(turn.inputs, output)
        if token.embed is not None:
            tensors[p.EMBED] = self._hidden(token.embed)
            self.metrics.tensor(p.EMBED, "out", self.gpu_tensors)
        if token.talker_prompt is not None:
            prompt = token.talker_prompt
            tensors.update({p.PROMPT_IDS: prompt.prompt_ids.numpy().astype(np.int64),
                            p.PROMPT_EMBEDS: self._hidden(prompt.prompt_embeds),
                            p.MM_HIDDEN: self._hidden(prompt.mm_hidden),
                            p.IMAGE_GRID_THW: (np.zeros((0, 3), np.int64) if prompt.image_grid_thw is None
                                               else prompt.image_grid_thw.numpy().astype(np.int64))})
        return tensors

    def _hidden(self, tensor):
        """FP32 hidden states for the talker: a CUDA tensor (DLPack, no host copy) or a numpy copy (always
        for an empty tensor: it has no device memory to share)."""
        tensor = tensor.float()
        return tensor.contiguous() if self.gpu_tensors and tensor.numel() else tensor.cpu().numpy()
