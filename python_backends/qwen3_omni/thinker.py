"""Qwen3-Omni thinker stage: chat messages (+ 16 kHz audio) -> text tokens, continuously batched.

Runs `Qwen3OmniMoeThinkerForConditionalGeneration` on the generic engine core (`EngineLoop`: one decode
forward for all live requests, per-request sampling) with one of two runners (`EngineOptions.engine`):
`DecoderRunner` ("dynamic", the CPU default: transformers' forward with a DynamicCache) or
`StaticRunner` ("static", GPU serving: chunked prefill, static KV cache, CUDA-graph decode steps; same
tokens, tested on CPU). Per generated token it
reports the token id and its layer-0 embedding (what the talker consumes, one per codec frame); with the
first token it also reports the prompt's layer-0 embeddings and the accept-layer hidden states of the
multimodal placeholder positions (`TalkerPrompt`, what the talker prefill needs).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from omni_backends.engine import DecoderRunner, EngineLoop, Prompt, SamplingParams, StepOutput, \
    text_mrope_position_ids
from omni_backends.engine import fused, sm_split
from omni_backends.engine.limits import longest_token_chars
from omni_backends.engine.options import EngineOptions
from omni_backends.engine.request import Marks
from omni_backends.engine.static_runner import StaticRunner
from omni_backends.qwen3_omni.decoder import StaticDecoder
from omni_backends.qwen3_omni.prompt import PromptBuilder, ThinkerInputs
from omni_backends.qwen3_omni.talker import TalkerPrompt


@dataclass
class ThinkerToken:
    """One thinker output of one request.

    Fields:
        token_id: generated token id, or None on a final output without a token (abort / error).
        index: 0-based index among the request's generated tokens (-1 without a token).
        embed: float [1, H_thinker] thinker layer-0 embedding (`embed_tokens`) of token_id, or None.
        talker_prompt: on index 0 only: the prompt tensors for the talker prefill.
        finished / finish_reason ("stop" | "length" | "abort" | "error") / error: as engine StepOutput.
    """

    token_id: int | None
    index: int
    embed: torch.Tensor | None
    talker_prompt: TalkerPrompt | None = None
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


OnToken = Callable[[str, ThinkerToken], None]


class Thinker:
    """Continuous-batching thinker; thread-safe `submit` / `abort` (the engine thread calls `on_token`).

    Args:
        model: `Qwen3OmniMoeThinkerForConditionalGeneration` (eval mode).
        config: the checkpoint's `Qwen3OmniMoeConfig`.
        tokenizer, feature_extractor: the checkpoint's tokenizer and `WhisperFeatureExtractor`.
        image_processor: the checkpoint's image processor (`loading.load_image_processor`); None: no image input.
        max_running: most requests decoded together.
        options: engine choice and sizes (`EngineOptions`).
        stream: CUDA stream of the engine thread (`EngineLoop`); None: the default stream.
        partition: the engine thread's SM partition (`sm_split`; `stream` should be one of its streams); None: the
            whole device.
    """

    def __init__(self, model, config, tokenizer, feature_extractor, max_running: int = 32,
                 options: EngineOptions | None = None, stream: torch.cuda.Stream | None = None,
                 partition: sm_split.Partition | None = None, image_processor=None):
        self.config, self.options = config, options or EngineOptions()
        self.accept_layer = config.talker_config.accept_hidden_layer
        self.prompts = PromptBuilder(tokenizer, feature_extractor, config.thinker_config.audio_config.n_window,
                                     image_processor, model.get_rope_index)
        self.longest_token = longest_token_chars(tokenizer)  # characters, for prompt-size checks before tokenizing
        self.mm_ids = torch.tensor([config.thinker_config.audio_token_id, config.thinker_config.image_token_id,
                                    config.thinker_config.video_token_id])
        self.embed_tokens = model.get_input_embeddings()
        layers = (0, self.accept_layer)
        if self.options.engine == "static":
            text_model = getattr(model.model, "language_model", model.model)   # transformers 5.2x / 5.1x
            decoder = StaticDecoder(text_model, head=lambda hidden: (fused.lm_head(model.lm_head, hidden).float(),),
                                    slots=max_running, max_len=self.options.max_len,
                                    graphs=self.options.cuda_graphs, name="thinker")
            runner = StaticRunner(model, decoder, self.embed_tokens, hidden_layers=layers,
                                  position_ids_fn=text_mrope_position_ids, prefill_chunk=self.options.prefill_chunk,
                                  prefill_graph_tokens=self.options.graph_prefill_tokens(decoder.device))
        else:
            runner = DecoderRunner(model, hidden_layers=layers, position_ids_fn=text_mrope_position_ids,
                                   prefill_chunk=self.options.prefill_chunk)
        self.loop = EngineLoop(runner, max_running=max_running, name="qwen3-omni-thinker", stream=stream,
                               partition=partition)

    def warmup(self) -> int:
        """Capture the static engine's decode and prefill graphs before serving (CUDA only); returns graphs
        captured."""
        runner = self.loop.runner
        decoder = getattr(runner, "decoder", None)
        if decoder is None:
            return 0
        with sm_split.within(self.loop.partition):
            captured = decoder.warmup()
            if runner.prefill_graphs is not None:
                with torch.inference_mode():
                    example = torch.tensor([self.config.im_start_token_id], device=decoder.device)
                    captured += runner.prefill_graphs.warmup(example)
        return captured

    @property
    def context_length(self) -> int:
        """Most prompt + generated tokens of one request (the model's positions, or the static cache)."""
        positions = self.config.thinker_config.text_config.max_position_embeddings
        return min(positions, self.options.max_len) if self.options.engine == "static" else positions

    def sampling_params(self, **overrides) -> SamplingParams:
        """SamplingParams stopping at `<|im_end|>` (im_end_token_id) unless `stop_token_ids` is given."""
        return SamplingParams(**{"stop_token_ids": (self.config.im_end_token_id,), **overrides})

    def submit(self, request_id: str, messages: Sequence[dict], params: SamplingParams, on_token: OnToken,
               audios: Sequence[np.ndarray] = (), images: Sequence[np.ndarray] = ()) -> ThinkerInputs:
        """Build the prompt and queue the request; returns the thinker inputs (prompt ids etc.).

        messages / audios / images: see `PromptBuilder.build` (audios: float32 mono 16 kHz, one per input_audio
        part; images: uint8 [H, W, 3], one per image part). Raises RequestError on a bad message, ValueError on a
        duplicate request id.
        """
        inputs = self.prompts.build(messages, audios, images)
        self.submit_inputs(request_id, inputs, params, on_token)
        return inputs

    def submit_inputs(self, request_id: str, inputs: ThinkerInputs, params: SamplingParams,
                      on_token: OnToken, embeds: bool = True, marks: Marks | None = None) -> None:
        """Queue a request from prebuilt `ThinkerInputs` (as `submit`, without prompt building). embeds=False:
        the tokens carry no `embed` (a consumer in this process looks the ids up itself); marks: gets the
        prefill's milestones (`EngineLoop.submit`)."""
        def on_output(rid: str, out: StepOutput) -> None:
            on_token(rid, self.token(inputs, out, embeds))

        self.loop.submit(request_id, self.engine_prompt(inputs), params, on_output, marks=marks)

    def engine_prompt(self, inputs: ThinkerInputs) -> Prompt:
        """The engine `Prompt` of `inputs`: audio features and image patches go to the prefill as model kwargs (on
        the model's device), a prompt with images brings its M-RoPE position ids."""
        model_kwargs = {}
        if inputs.input_features is not None:
            model_kwargs = {"input_features": inputs.input_features,
                            "feature_attention_mask": inputs.feature_attention_mask}
        if inputs.pixel_values is not None:
            model_kwargs.update(pixel_values=inputs.pixel_values, image_grid_thw=inputs.image_grid_thw)
        device = self.embed_tokens.weight.device
        return Prompt(input_ids=inputs.input_ids, position_ids=inputs.position_ids, next_position=inputs.next_position,
                      model_kwargs={k: v.to(device) for k, v in model_kwargs.items()})

    def abort(self, request_id: str) -> bool:
        """Cancel a request; it gets a final ThinkerToken with finish_reason "abort". False if unknown."""
        return self.loop.abort(request_id)

    def shutdown(self) -> None:
        """Abort everything in flight and stop the engine thread."""
        self.loop.shutdown()

    @torch.inference_mode()
    def token(self, inputs: ThinkerInputs, out: StepOutput, embeds: bool = True) -> ThinkerToken:
        """The `ThinkerToken` of one engine output of a request whose prompt is `inputs`: adds the token's layer-0
        embedding (unless `embeds` is False) and, on index 0, the `TalkerPrompt` (prompt ids, image grids)."""
        embed = None if out.token_id is None or not embeds else self.embed_tokens(
            torch.tensor([out.token_id], device=self.embed_tokens.weight.device))
        talker_prompt = None
        if out.index == 0:
            mm = torch.isin(inputs.input_ids, self.mm_ids).to(out.hidden_states[0].device)
            talker_prompt = TalkerPrompt(prompt_ids=inputs.input_ids, prompt_embeds=out.hidden_states[0],
                                         mm_hidden=out.hidden_states[self.accept_layer][mm],
                                         image_grid_thw=inputs.image_grid_thw)
        return ThinkerToken(token_id=out.token_id, index=out.index, embed=embed, talker_prompt=talker_prompt,
                            finished=out.finished, finish_reason=out.finish_reason, error=out.error)
