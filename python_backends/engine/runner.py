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

import inspect
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
from transformers.cache_utils import DynamicCache

from omni_backends.engine.kv_batch import KVBatch, LayerKV, cache_layers
from omni_backends.engine.prefix_cache import PrefixCache
from omni_backends.engine.request import EngineRequest

PositionIdsFn = Callable[[torch.Tensor], torch.Tensor]
# request.state keys of a chunked prefill in progress
_PREFILLED, _CACHE, _HIDDEN = "prefilled_tokens", "prefill_cache", "prefill_hidden"
Cached = tuple[tuple[int, ...], list[LayerKV]] | None  # a PrefixCache hit: (prefix ids, layers)


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
        """Run the prompts of requests not yet prefilled, keep their caches, return one entry per request
        (same order): a RowOutput once its prompt is complete, None while a chunked prefill is not done."""

    def decode(self, requests: Sequence[EngineRequest], token_ids: torch.Tensor) -> list[RowOutput]:
        """Feed token_ids (int64 [B], one per request, same order) to all given live requests in one step."""

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget these requests' caches (unknown ids are ignored)."""

    def reset(self) -> None:
        """Forget every request (after an engine crash: start from a clean state)."""


def cache_kwargs(model: torch.nn.Module, cache) -> dict:
    """The forward kwarg for a KV cache: transformers >= 5.2x calls it `cache`, earlier 5.x `past_key_values`
    (the GPU image has 5.17). The cache object is updated in place either way."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def text_mrope_position_ids(positions: torch.Tensor, sections: int = 4) -> torch.Tensor:
    """mRoPE position ids for text-only tokens: int64 [B, L] -> [sections, B, L], all rows equal.

    Qwen3-Omni's thinker takes 4 rows (text, t, h, w); Qwen2.5-VL style models take 3.
    """
    return positions.unsqueeze(0).expand(sections, *positions.shape)


def _from_prefix(prefix: Cached, rows: int) -> DynamicCache:
    """A cache of `rows` rows that starts with a kept prefix (`PrefixCache.lookup`'s result). The forward
    appends to copies (DynamicLayer.update concatenates), so the kept entry stays intact."""
    return DynamicCache(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in prefix[1]])


class DecoderRunner:
    """Runner for a transformers causal LM with a full-attention DynamicCache.

    Args:
        model: the causal LM (eval mode is set here); forward must accept a cache (`cache_kwargs`).
        hidden_layers: indexes into the model's `hidden_states` tuple to return per token (0 = input
            embeddings, i = output of decoder layer i); empty: hidden states are not computed.
        position_ids_fn: maps text positions int64 [B, L] to the model's position_ids layout
            (default: unchanged [B, L]; Qwen3-Omni thinker: `text_mrope_position_ids`).
        max_prefill_batch: most plain prompts prefilled together in one forward.
        prefix_cache: keeps the keys/values of shared prompt prefixes (`Prompt.cache_prefixes`); prompts
            of input_ids that start with a kept prefix are prefilled from it (whole or chunked). None:
            every prefill is full.
            Not combinable with hidden_layers (a cached prefix has no hidden states to return).
        prefill_chunk: prompt tokens one `prefill` call processes (0: no limit; `EngineOptions.prefill_chunk`,
            as the static engine's). Whole prompts that fit are batched within it; a prompt that does not
            fit is prefilled chunk by chunk over several calls (chunked prefill: the loop decodes the running
            requests between chunks, so a long prompt never stalls them for more than one chunk; it starts
            after its longest kept prefix). A prompt with explicit position_ids or model_kwargs (e.g. audio
            features) is never split.

    Per-request caches live in one `KVBatch`; `decode` runs ONE forward for every live request.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        hidden_layers: Sequence[int] = (),
        position_ids_fn: PositionIdsFn | None = None,
        max_prefill_batch: int = 8,
        prefix_cache: PrefixCache | None = None,
        prefill_chunk: int = 512,
    ) -> None:
        if max_prefill_batch < 1:
            raise ValueError(f"max_prefill_batch must be >= 1, got {max_prefill_batch}")
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {prefill_chunk}")
        if prefix_cache is not None and hidden_layers:
            raise ValueError("prefix_cache cannot be combined with hidden_layers")
        self.prefix_cache = prefix_cache
        self.model = model.eval()
        self.hidden_layers = tuple(hidden_layers)
        self.position_ids_fn = position_ids_fn or (lambda positions: positions)
        self.max_prefill_batch = max_prefill_batch
        self.prefill_chunk = prefill_chunk
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
        full = self.prefill_chunk or float("inf")
        budget = full
        results: dict[str, RowOutput | None] = {r.request_id: None for r in requests}
        solo, whole = [], []  # prompts run now in one piece
        for r in requests:  # FIFO within the token budget
            if budget <= 0:
                break
            left = len(r.prompt) - r.state.get(_PREFILLED, 0)
            if r.prompt.solo:
                if left > budget and budget < full:
                    break  # never split: it runs first thing in the next call
                solo.append(r)
            elif _PREFILLED not in r.state and left <= budget:
                whole.append(r)
            else:
                results[r.request_id] = self._prefill_chunk(r, int(min(left, budget)))
            budget -= left
        groups: list[tuple[list[EngineRequest], Cached]] = [([r], None) for r in solo]
        for kind in ("input_ids", "inputs_embeds"):
            for prefix, same in self._by_cached_prefix([r for r in whole if getattr(r.prompt, kind) is not None]):
                groups += [(same[i : i + self.max_prefill_batch], prefix)
                           for i in range(0, len(same), self.max_prefill_batch)]
        for group, prefix in groups:
            results.update(zip((r.request_id for r in group), self._prefill_group(group, prefix)))
        return [results[r.request_id] for r in requests]

    def _prefill_chunk(self, request: EngineRequest, n: int) -> RowOutput | None:
        """Feed the next `n` prompt tokens of one request into its own cache (kept in request.state);
        once the prompt is complete its cache joins the KV batch and its RowOutput is returned."""
        state, prompt = request.state, request.prompt
        if _CACHE not in state:
            state[_CACHE] = self._chunk_start(request)
        cache, done = state[_CACHE], state.get(_PREFILLED, 0)
        n = min(n, len(prompt) - done)
        if prompt.input_ids is not None:
            inputs = {"input_ids": prompt.input_ids[done : done + n][None].to(self.device)}
        else:
            inputs = {"inputs_embeds": prompt.inputs_embeds[done : done + n][None].to(self.device)}
        positions = torch.arange(done, done + n, device=self.device)[None]
        out = self.model(**inputs, attention_mask=torch.ones(1, done + n, dtype=torch.long, device=self.device),
                         position_ids=self.position_ids_fn(positions), **cache_kwargs(self.model, cache),
                         use_cache=True, output_hidden_states=bool(self.hidden_layers))
        state[_PREFILLED] = done + n
        row = self._row_output(out, 0, n)
        if self.hidden_layers:
            state.setdefault(_HIDDEN, []).append(row.hidden_states)
        if done + n < len(prompt):
            return None
        self.kv.add([(request.request_id, cache_layers(cache, 0, done + n))])
        self._remember_prefixes([request], cache)
        chunks = state.pop(_HIDDEN, [])
        state.pop(_CACHE, None)
        return RowOutput(logits=row.logits,
                         hidden_states={layer: torch.cat([c[layer] for c in chunks]) for layer in self.hidden_layers})

    def _chunk_start(self, request: EngineRequest) -> DynamicCache:
        """The cache a chunked prefill starts from: the longest kept prefix of its input_ids (marked as
        prefilled), else an empty one."""
        found = None
        if self.prefix_cache is not None and request.prompt.input_ids is not None:
            found = self.prefix_cache.lookup(request.prompt.input_ids.tolist())
        if found is None:
            return DynamicCache(config=self.model.config)
        request.state[_PREFILLED] = len(found[0])
        return _from_prefix(found, 1)

    def _by_cached_prefix(self, requests: list[EngineRequest]) -> list[tuple[Cached, list[EngineRequest]]]:
        """Requests grouped by the cached prefix their input_ids start with (None: no usable prefix)."""
        if self.prefix_cache is None or not requests or requests[0].prompt.input_ids is None:
            return [(None, requests)] if requests else []
        groups: dict[tuple[int, ...] | None, tuple[Cached, list[EngineRequest]]] = {}
        for r in requests:
            found = self.prefix_cache.lookup(r.prompt.input_ids.tolist())
            groups.setdefault(found[0] if found else None, (found, []))[1].append(r)
        return list(groups.values())

    def _remember_prefixes(self, group: list[EngineRequest], cache: DynamicCache) -> None:
        """Store the `cache_prefixes` keys/values of the group's prompts that the prefix cache lacks."""
        if self.prefix_cache is None:
            return
        for row, r in enumerate(group):
            if r.prompt.input_ids is None:
                continue
            for n in r.prompt.cache_prefixes:
                ids = r.prompt.input_ids[:n].tolist()
                if ids not in self.prefix_cache:
                    self.prefix_cache.store(ids, cache_layers(cache, row, n))

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
            **cache_kwargs(self.model, cache),
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

    def _prefill_group(self, group: list[EngineRequest], prefix: Cached = None) -> list[RowOutput]:
        """One right-padded forward over prompts of one kind (after their shared cached `prefix`, if any);
        caches join the KV batch."""
        skip = len(prefix[0]) if prefix else 0
        lengths = [len(r.prompt) - skip for r in group]
        width = max(lengths)
        mask = torch.tensor([[1] * (skip + n) + [0] * (width - n) for n in lengths], dtype=torch.long,
                            device=self.device)
        first = group[0].prompt
        if first.input_ids is not None:
            ids = torch.zeros(len(group), width, dtype=torch.long)
            for row, r in enumerate(group):
                ids[row, : lengths[row]] = r.prompt.input_ids[skip:]
            inputs = {"input_ids": ids.to(self.device)}
        else:
            embeds = first.inputs_embeds.new_zeros(len(group), width, first.inputs_embeds.shape[-1])
            for row, r in enumerate(group):
                embeds[row, : lengths[row]] = r.prompt.inputs_embeds
            inputs = {"inputs_embeds": embeds.to(self.device)}
        if first.position_ids is not None:  # a solo prompt with explicit positions
            position_ids = first.position_ids.to(self.device)
        else:
            positions = torch.arange(skip, skip + width, device=self.device).expand(len(group), width)
            position_ids = self.position_ids_fn(positions)
        cache = _from_prefix(prefix, len(group)) if prefix else DynamicCache(config=self.model.config)
        out = self.model(
            **inputs,
            **first.model_kwargs,
            attention_mask=mask,
            position_ids=position_ids,
            **cache_kwargs(self.model, cache),
            use_cache=True,
            output_hidden_states=bool(self.hidden_layers),
        )
        self.kv.add([(r.request_id, cache_layers(cache, row, skip + lengths[row])) for row, r in enumerate(group)])
        self._remember_prefixes(group, cache)
        return [self._row_output(out, row, lengths[row]) for row in range(len(group))]

    def _row_output(self, out, row: int, n_fed: int) -> RowOutput:
        """Logits after the row's last real token and hidden states of its n_fed real tokens."""
        hidden = {layer: out.hidden_states[layer][row, :n_fed].clone() for layer in self.hidden_layers}
        return RowOutput(logits=out.logits[row, n_fed - 1].float(), hidden_states=hidden)
