"""Model runners: the model-specific half of the engine.

`EngineLoop` schedules and samples; a runner owns the model and the KV caches and turns requests into
next-token logits. `DecoderRunner` wraps any transformers decoder LM that accepts
`(input_ids | inputs_embeds, attention_mask, position_ids, cache, use_cache, output_hidden_states)`
and returns `.logits` / `.hidden_states` (Llama, Qwen2/3, the Qwen3-Omni thinker, ...). A new model
plugs in by constructor arguments (`position_ids_fn`, `hidden_layers`) or by overriding
`decode_inputs` (e.g. a talker feeding embeddings it builds from its own state); anything else can
implement the `Runner` protocol directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
from transformers.cache_utils import DynamicCache

from omni_backends.engine.kv_batch import KVBatch, cache_layers
from omni_backends.engine.request import EngineRequest

PositionIdsFn = Callable[[torch.Tensor], torch.Tensor]
# request.state keys of a chunked prefill in progress
_PREFILLED, _CACHE, _HIDDEN = "prefilled_tokens", "prefill_cache", "prefill_hidden"


@dataclass
class RowOutput:
    """One request's result of a forward.

    Fields:
        logits: float32 [vocab], next-token logits after the last fed token.
        hidden_states: {layer: float [n_fed, hidden]} for the requested hidden layers.
    """

    logits: torch.Tensor
    hidden_states: dict[int, torch.Tensor] = field(default_factory=dict)


class Runner(Protocol):
    """What EngineLoop needs from a model runner. All calls come from the engine thread."""

    def prefill(self, requests: Sequence[EngineRequest]) -> list[RowOutput | None]:
        """Advance the prefill of admitted requests (same order); a request whose prompt is complete
        gets its RowOutput (its cache is kept for decode), one still in progress gets None (the loop
        calls prefill again for it next iteration: chunked prefill)."""

    def decode(self, requests: Sequence[EngineRequest], token_ids: torch.Tensor) -> list[RowOutput]:
        """Feed token_ids (int64 [B], one per request, same order) to all given live requests in one step."""

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget these requests' caches (unknown ids are ignored)."""

    def reset(self) -> None:
        """Forget every request (after an engine crash: start from a clean state)."""


def text_mrope_position_ids(positions: torch.Tensor, sections: int = 4) -> torch.Tensor:
    """mRoPE position ids for text-only tokens: int64 [B, L] -> [sections, B, L], all rows equal.

    Qwen3-Omni's thinker takes 4 rows (text, t, h, w); Qwen2.5-VL style models take 3.
    """
    return positions.unsqueeze(0).expand(sections, *positions.shape)


class DecoderRunner:
    """Runner for a transformers causal LM with a full-attention DynamicCache.

    Args:
        model: the causal LM (eval mode is set here); forward must accept `cache=` (transformers 5).
        hidden_layers: indexes into the model's `hidden_states` tuple to return per token (0 = input
            embeddings, i = output of decoder layer i); empty: hidden states are not computed.
        position_ids_fn: maps text positions int64 [B, L] to the model's position_ids layout
            (default: unchanged [B, L]; Qwen3-Omni thinker: `text_mrope_position_ids`).
        max_prefill_batch: most plain prompts prefilled together in one forward.
        max_prefill_tokens: prompt tokens one `prefill` call processes (None: unbounded). Whole short
            prompts are batched within it; a prompt that does not fit is prefilled chunk by chunk over
            several calls (chunked prefill: the loop decodes the running requests between chunks).
            A prompt with explicit position_ids or model_kwargs (e.g. audio features) is never split.

    Per-request caches live in one `KVBatch`; `decode` runs ONE forward for every live request.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        hidden_layers: Sequence[int] = (),
        position_ids_fn: PositionIdsFn | None = None,
        max_prefill_batch: int = 8,
        max_prefill_tokens: int | None = 512,
    ) -> None:
        if max_prefill_batch < 1:
            raise ValueError(f"max_prefill_batch must be >= 1, got {max_prefill_batch}")
        if max_prefill_tokens is not None and max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1 or None, got {max_prefill_tokens}")
        self.model = model.eval()
        self.hidden_layers = tuple(hidden_layers)
        self.position_ids_fn = position_ids_fn or (lambda positions: positions)
        self.max_prefill_batch = max_prefill_batch
        self.max_prefill_tokens = max_prefill_tokens
        self.kv = KVBatch()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def decode_inputs(self, requests: Sequence[EngineRequest], token_ids: torch.Tensor) -> dict:
        """Forward inputs for one decode step (override for models fed with embeddings).

        Args:
            requests: the live requests in KV-batch row order.
            token_ids: int64 [B] the token each request feeds now (its last generated token).

        Returns:
            kwargs for the model forward, e.g. {"input_ids": int64 [B, 1]} (the default) or
            {"inputs_embeds": float [B, 1, hidden], ...}. attention_mask, position_ids and cache are
            added by the runner.
        """
        return {"input_ids": token_ids.to(self.device).unsqueeze(1)}

    @torch.inference_mode()
    def prefill(self, requests: Sequence[EngineRequest]) -> list[RowOutput | None]:
        budget = self.max_prefill_tokens if self.max_prefill_tokens is not None else float("inf")
        full = budget
        results: dict[str, RowOutput | None] = {r.request_id: None for r in requests}
        whole: list[EngineRequest] = []  # plain prompts that fit: batched below
        for r in requests:
            if budget <= 0:
                break
            done = r.state.get(_PREFILLED, 0)
            left = len(r.prompt) - done
            if r.prompt.solo:
                if left > budget and budget < full:
                    break  # never split: it runs first thing in the next call
                results[r.request_id] = self._prefill_group([r])[0]
            elif done == 0 and left <= budget:
                whole.append(r)
            else:
                results[r.request_id] = self._prefill_chunk(r, int(min(left, budget)))
            budget -= left
        for kind in ("input_ids", "inputs_embeds"):
            same = [r for r in whole if getattr(r.prompt, kind) is not None]
            for i in range(0, len(same), self.max_prefill_batch):
                group = same[i : i + self.max_prefill_batch]
                results.update(zip((r.request_id for r in group), self._prefill_group(group)))
        return [results[r.request_id] for r in requests]

    @torch.inference_mode()
    def decode(self, requests: Sequence[EngineRequest], token_ids: torch.Tensor) -> list[RowOutput]:
        by_id = {r.request_id: (r, t) for r, t in zip(requests, token_ids.tolist())}
        if sorted(by_id) != sorted(self.kv.request_ids):
            raise ValueError("decode() must get exactly the live requests of the KV batch")
        rows = [by_id[rid][0] for rid in self.kv.request_ids]
        tokens = torch.tensor([by_id[rid][1] for rid in self.kv.request_ids], dtype=torch.long)
        cache, mask = self.kv.step_inputs(1)
        positions = torch.tensor([[r.next_position] for r in rows], dtype=torch.long, device=self.device)
        out = self.model(
            **self.decode_inputs(rows, tokens),
            attention_mask=mask,
            position_ids=self.position_ids_fn(positions),
            cache=cache,
            use_cache=True,
            output_hidden_states=bool(self.hidden_layers),
        )
        self.kv.advance(1)
        for r in rows:
            r.next_position += 1
        outputs = {r.request_id: self._row_output(out, i, 1) for i, r in enumerate(rows)}
        return [outputs[r.request_id] for r in requests]

    def release(self, request_ids: Sequence[str]) -> None:
        self.kv.remove(list(request_ids))

    def reset(self) -> None:
        self.kv = KVBatch()

    def _prefill_chunk(self, request: EngineRequest, n: int) -> RowOutput | None:
        """Feed the next `n` prompt tokens of one request into its own cache (kept in request.state);
        once the prompt is complete its cache joins the KV batch and its RowOutput is returned."""
        state, prompt = request.state, request.prompt
        done = state.get(_PREFILLED, 0)
        cache = state.setdefault(_CACHE, DynamicCache(config=self.model.config))
        if prompt.input_ids is not None:
            inputs = {"input_ids": prompt.input_ids[done : done + n][None].to(self.device)}
        else:
            inputs = {"inputs_embeds": prompt.inputs_embeds[done : done + n][None].to(self.device)}
        positions = torch.arange(done, done + n, device=self.device)[None]
        out = self.model(**inputs, attention_mask=torch.ones(1, done + n, dtype=torch.long, device=self.device),
                         position_ids=self.position_ids_fn(positions), cache=cache, use_cache=True,
                         output_hidden_states=bool(self.hidden_layers))
        state[_PREFILLED] = done + n
        row = self._row_output(out, 0, n)
        if self.hidden_layers:
            state.setdefault(_HIDDEN, []).append(row.hidden_states)
        if done + n < len(prompt):
            return None
        self.kv.add([(request.request_id, cache_layers(out.cache, 0, done + n))])
        chunks = state.pop(_HIDDEN, [])
        hidden = {layer: torch.cat([c[layer] for c in chunks]) for layer in self.hidden_layers}
        state.pop(_CACHE, None)
        return RowOutput(logits=row.logits, hidden_states=hidden)

    def _prefill_group(self, group: list[EngineRequest]) -> list[RowOutput]:
        """One right-padded forward over prompts of one kind; caches join the KV batch."""
        lengths = [len(r.prompt) for r in group]
        width = max(lengths)
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long, device=self.device)
        first = group[0].prompt
        if first.input_ids is not None:
            ids = torch.zeros(len(group), width, dtype=torch.long)
            for row, r in enumerate(group):
                ids[row, : lengths[row]] = r.prompt.input_ids
            inputs = {"input_ids": ids.to(self.device)}
        else:
            embeds = first.inputs_embeds.new_zeros(len(group), width, first.inputs_embeds.shape[-1])
            for row, r in enumerate(group):
                embeds[row, : lengths[row]] = r.prompt.inputs_embeds
            inputs = {"inputs_embeds": embeds.to(self.device)}
        if first.position_ids is not None:  # a solo prompt with explicit positions
            position_ids = first.position_ids.to(self.device)
        else:
            position_ids = self.position_ids_fn(torch.arange(width, device=self.device).expand(len(group), width))
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            **inputs,
            **first.model_kwargs,
            attention_mask=mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
            output_hidden_states=bool(self.hidden_layers),
        )
        self.kv.add([(r.request_id, cache_layers(out.cache, row, lengths[row])) for row, r in enumerate(group)])
        return [self._row_output(out, row, lengths[row]) for row in range(len(group))]

    def _row_output(self, out, row: int, n_fed: int) -> RowOutput:
        """Logits after the row's last real token and hidden states of its n_fed real tokens."""
        hidden = {layer: out.hidden_states[layer][row, :n_fed].clone() for layer in self.hidden_layers}
        return RowOutput(logits=out.logits[row, n_fed - 1].float(), hidden_states=hidden)
