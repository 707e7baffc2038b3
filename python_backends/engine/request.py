"""What a request brings (Prompt), what it gets back per token (StepOutput), and its live state."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

import torch

from omni_backends.engine.sampling import SamplingParams, make_generator

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class Prompt:
    """The prefill input of one request; exactly one of input_ids / inputs_embeds.

    Fields:
        input_ids: int64 [L] prompt token ids.
        inputs_embeds: float [L, hidden] prompt embeddings (e.g. a talker prefill built by the caller).
        position_ids: optional explicit position ids in the model's own layout for batch 1, e.g.
            int64 [1, L] (Llama) or [4, 1, L] (Qwen3-Omni thinker with mRoPE). None: 0..L-1 passed
            through the runner's position builder.
        next_position: text position of the first decoded token; None: L, or max(position_ids) + 1
            when position_ids is given (the mRoPE rule).
        model_kwargs: extra forward kwargs for the prefill only (e.g. input_features,
            feature_attention_mask, pixel_values, image_grid_thw), batch 1.
        cache_prefixes: leading lengths of input_ids that later prompts are likely to start with (e.g. a
            chat template's system prompt, and the whole prompt, which the conversation's next turn starts
            with), each in [1, L]: a runner with a PrefixCache keeps their keys/values after this prefill,
            and later prefills start after the longest kept one. (): nothing worth keeping.
    A prompt with position_ids or model_kwargs is prefilled alone; plain prompts arriving together
    are prefilled in one right-padded batch.
    """

    input_ids: torch.Tensor | None = None
    inputs_embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    next_position: int | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    cache_prefixes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if (self.input_ids is None) == (self.inputs_embeds is None):
            raise ValueError("Prompt needs exactly one of input_ids or inputs_embeds")
        if self.input_ids is not None:
            self.input_ids = torch.as_tensor(self.input_ids, dtype=torch.long).reshape(-1)
        elif self.inputs_embeds.ndim != 2:
            raise ValueError(f"inputs_embeds must be [L, hidden], got shape {tuple(self.inputs_embeds.shape)}")
        if len(self) == 0:
            raise ValueError("Prompt is empty")
        if any(not 1 <= n <= len(self) for n in self.cache_prefixes):
            raise ValueError(f"cache_prefixes must each be in [1, {len(self)}], got {self.cache_prefixes}")
        if self.next_position is None:
            self.next_position = len(self) if self.position_ids is None else int(self.position_ids.max()) + 1

    def __len__(self) -> int:
        return (self.input_ids if self.input_ids is not None else self.inputs_embeds).shape[0]

    @property
    def solo(self) -> bool:
        """True when this prompt must be prefilled on its own (explicit positions or extra kwargs)."""
        return self.position_ids is not None or bool(self.model_kwargs)


@dataclass
class StepOutput:
    """One engine output of one request.

    Fields:
        token_id: the generated token, or None for a final output without a token (abort, error).
        index: 0-based index of token_id among the request's generated tokens (-1 when token_id is None).
        hidden_states: {layer: float [n, hidden]} for the runner's hidden_layers, for the n tokens FED in
            the forward that produced token_id (n = prompt length for index 0, then 1: the previous
            generated token). Layer 0 is the input embedding. Empty when no layers were asked for.
        finished: True on the request's last output (exactly one per request).
        finish_reason: "stop" | "length" | "abort" | "error" when finished, else None.
        error: the error text when finish_reason is "error".
        unavailable: with "error": the engine as a whole failed (not this request); it restarts, and the
            request may be retried (HTTP 503).
    """

    token_id: int | None
    index: int = -1
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    unavailable: bool = False


OnOutput = Callable[[str, StepOutput], None]
IsCancelled = Callable[[], bool]


class Marks(Protocol):
    """Receives a request's milestones inside the engine: `mark(name, at)` with `at` a `time.monotonic()` time;
    names "prefill_start" (its first prefill forward starts) and "prefill_end" (its first token was sampled, so
    its prefill is done on the device too). E.g. `qwen3_omni.first_audio.FirstAudioTimeline`."""

    def mark(self, name: str, at: float | None = None) -> None: ...


class EngineRequest:
    """Live state of one request inside the engine (owned by the engine thread).

    Attributes: request_id, prompt, params, on_output, output_ids (list[int] generated so far),
    next_position (text position of the next token to feed), generator (per-request RNG or None),
    prefilled (the whole prompt has been run), cancelled (optional callable: True once the caller gave up;
    asked before each prefill step), submitted_at (time.monotonic() of submit), state (dict a
    model-specific runner may use for its own per-request data, e.g. a partial prefill), marks (optional
    `Marks` receiving the request's prefill milestones).
    """

    def __init__(self, request_id: str, prompt: Prompt, params: SamplingParams, on_output: OnOutput,
                 cancelled: IsCancelled | None = None, marks: Marks | None = None):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.on_output = on_output
        self.cancelled = cancelled
        self.output_ids: list[int] = []
        self.next_position = prompt.next_position
        self.generator = make_generator(params.seed)
        self.prefilled = False
        self.submitted_at = time.monotonic()
        self.state: dict[str, Any] = {}
        self.marks = marks

    def output_tensor(self) -> torch.Tensor:
        """int64 [n]: the ids generated so far."""
        return torch.tensor(self.output_ids, dtype=torch.long)

    def seen_token_ids(self) -> torch.Tensor:
        """int64 [n]: prompt ids (when the prompt has ids) followed by the generated ids."""
        generated = self.output_tensor()
        if self.prompt.input_ids is None:
            return generated
        return torch.cat([self.prompt.input_ids, generated])
