"""StaticRunner: prefill by the model's own forward (chunked), decode by a static-cache graph decoder.

The `Runner` for GPU serving. A prompt runs through transformers' forward into a `DynamicCache`, at
most `prefill_chunk` tokens per engine iteration, so a long prompt is spread over several iterations
and the running streams decode in between (chunked prefill); prompts with extra model inputs (audio
features) run whole; short plain prompts arriving together run in one right-padded forward, and a short plain
prompt arriving alone, with `prefill_graphs`, replays a CUDA graph of the forward for its length bucket
(`PrefillGraphs`). When a prompt is complete its KV is copied into a slot of the decoder's
`StaticKVCache`, and from then on the request decodes in the decoder's fixed-shape (CUDA-graph) step
together with every other live request.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache

from omni_backends.engine.kv_batch import cache_layers
from omni_backends.engine.prefill_graphs import PrefillGraphs
from omni_backends.engine.request import EngineRequest
from omni_backends.engine.runner import PositionIdsFn, RowOutput, cache_kwargs
from omni_backends.engine.static_kv import LayerKV
from omni_backends.engine.transfer import to_device


class Decoder(Protocol):
    """What StaticRunner needs from a static-cache decoder (`omni_backends.qwen3_omni.decoder.StaticDecoder`)."""

    cache: object  # a StaticKVCache: request_ids in slot order, free_slots

    def add(self, request_id: str, layers: list[LayerKV]) -> int: ...

    def add_rows(self, request_ids: list[str], lengths: list[int], layers: list[LayerKV]) -> list[int]: ...

    def remove(self, request_ids: Sequence[str]) -> None: ...

    def step(self, embeds: torch.Tensor, rope_positions: Sequence[int]) -> tuple[torch.Tensor, ...]: ...


@dataclass
class _Prefill:
    cache: DynamicCache
    done: int = 0
    hidden: dict[int, list[torch.Tensor]] = field(default_factory=dict)


class StaticRunner:
    """Runner: chunked prefill with `model`, decode with `decoder` (its step returns (logits [n, vocab],)).

    Args:
        model: the causal LM (transformers), e.g. the Qwen3-Omni thinker.
        decoder: a static-cache decoder over the same weights (see `Decoder`).
        embed: the model's input embedding (token ids -> decode inputs).
        hidden_layers: hidden states to return for the prompt tokens (0 = input embeddings).
        position_ids_fn: text positions int64 [1, L] -> the model's position_ids layout.
        prefill_chunk: most prompt tokens run per engine iteration over all prefilling requests; 0: no limit.
        cache_config: config for the prefill's `DynamicCache` (default: the model's).
        max_prefill_batch: most whole prompts prefilled together in one forward.
        prefill_graph_tokens: a lone whole plain prompt of up to this many tokens is prefilled by `PrefillGraphs`
            (right-padded to its length bucket, `padded_forward`); 0: eager forwards only.
        graphs: let `PrefillGraphs` capture CUDA graphs (else its padded forward runs eagerly).
    """

    def __init__(self, model: torch.nn.Module, decoder: Decoder, embed: torch.nn.Module, *,
                 hidden_layers: Sequence[int] = (), position_ids_fn: PositionIdsFn | None = None,
                 prefill_chunk: int = 512, cache_config=None, max_prefill_batch: int = 16,
                 prefill_graph_tokens: int = 0, graphs: bool = True) -> None:
        if prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {prefill_chunk}")
        self.model, self.decoder, self.embed = model.eval(), decoder, embed
        self.hidden_layers = tuple(hidden_layers)
        self.position_ids_fn: Callable = position_ids_fn or (lambda positions: positions)
        self.prefill_chunk = prefill_chunk
        self.cache_config = cache_config or model.config
        self.max_prefill_batch = max_prefill_batch
        self.prefill_graphs = PrefillGraphs(self.padded_forward, hidden=len(self.hidden_layers),
                                            max_tokens=prefill_graph_tokens, max_batch=max_prefill_batch,
                                            graphs=graphs,
                                            name="prefill") if prefill_graph_tokens else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def prefill(self, requests: Sequence[EngineRequest]) -> list[RowOutput | None]:
        """Advance each request's prompt within this iteration's token budget; a RowOutput for each prompt
        that completed (its KV now in a decoder slot), None for the others (including those beyond the
        free slots, which wait). Plain prompts that fit the budget whole run together in one right-padded
        forward; longer ones (and prompts with extra model inputs) run alone, chunk by chunk."""
        budget = self.prefill_chunk or float("inf")
        slots = self.decoder.cache.free_slots
        out: dict[str, RowOutput | None] = {}
        whole: list[EngineRequest] = []
        for request in requests:
            out[request.request_id] = None
            if budget <= 0 or slots <= 0:
                continue
            prompt, state = request.prompt, request.state.get("prefill")
            if state is None and not prompt.solo and len(prompt) <= budget and len(whole) < self.max_prefill_batch:
                whole.append(request)
                budget, slots = budget - len(prompt), slots - 1
                continue
            state = request.state.setdefault("prefill", _Prefill(DynamicCache(config=self.cache_config)))
            remaining = len(prompt) - state.done
            count = remaining if prompt.model_kwargs else int(min(remaining, budget))
            logits = self._run_chunk(request, state, count)
            budget -= count
            if state.done < len(prompt):
                continue
            self.decoder.add(request.request_id, cache_layers(state.cache))
            slots -= 1
            del request.state["prefill"]
            out[request.request_id] = RowOutput(logits=logits,
                                                hidden_states={k: torch.cat(v) for k, v in state.hidden.items()})
        for kind in ("input_ids", "inputs_embeds"):
            group = [r for r in whole if getattr(r.prompt, kind) is not None]
            if group and kind == "input_ids" and self.prefill_graphs is not None \
                    and self.prefill_graphs.fits_batch([len(r.prompt) for r in group]):
                out.update(zip((r.request_id for r in group), self._prefill_graphed(group)))
            elif group:
                out.update(zip((r.request_id for r in group), self._prefill_together(group, kind)))
        return [out[r.request_id] for r in requests]

    def _prefill_together(self, group: list[EngineRequest], kind: str) -> list[RowOutput]:
        """One right-padded forward over whole plain prompts; each row's KV goes to its own slot."""
        lengths = [len(r.prompt) for r in group]
        width = max(lengths)
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths], dtype=torch.long, device=self.device)
        if kind == "input_ids":
            data = torch.zeros(len(group), width, dtype=torch.long)
        else:
            data = group[0].prompt.inputs_embeds.new_zeros(len(group), width, group[0].prompt.inputs_embeds.shape[-1])
        for row, r in enumerate(group):
            data[row, :lengths[row]] = getattr(r.prompt, kind)
        cache = DynamicCache(config=self.cache_config)
        positions = self.position_ids_fn(torch.arange(width, device=self.device).expand(len(group), width))
        out = self.model(**{kind: data.to(self.device)}, attention_mask=mask, position_ids=positions,
                         **cache_kwargs(self.model, cache), use_cache=True, output_hidden_states=bool(self.hidden_layers))
        rows = []
        for row, r in enumerate(group):
            self.decoder.add(r.request_id, cache_layers(cache, row, lengths[row]))
            hidden = {layer: out.hidden_states[layer][row, :lengths[row]].clone() for layer in self.hidden_layers}
            rows.append(RowOutput(logits=out.logits[row, lengths[row] - 1].float(), hidden_states=hidden))
        return rows

    def _prefill_graphed(self, group: list[EngineRequest]) -> list[RowOutput]:
        """Whole plain prompts through `prefill_graphs` in one padded forward (each row's KV copied into its
        decoder slot)."""
        batch = self.prefill_graphs.run_batch([r.prompt.input_ids.to(self.device) for r in group])
        self.decoder.add_rows([r.request_id for r in group], [len(r.prompt) for r in group], batch.layers)
        return [RowOutput(logits=result.logits.float(), hidden_states=dict(zip(self.hidden_layers, result.hidden)))
                for result in batch.rows]

    def padded_forward(self, input_ids: torch.Tensor):
        """The forward `PrefillGraphs` captures: input_ids [B, W] (right-padded) -> (logits [B, W, V], the
        `hidden_layers` states [B, W, H] each, the DynamicCache); pure causal attention, positions 0..W-1."""
        cache = DynamicCache(config=self.cache_config)
        width = input_ids.shape[1]
        positions = self.position_ids_fn(torch.arange(width, device=input_ids.device).expand(input_ids.shape[0], width))
        out = self.model(input_ids=input_ids, position_ids=positions, **cache_kwargs(self.model, cache),
                         use_cache=True, output_hidden_states=bool(self.hidden_layers))
        return out.logits, [out.hidden_states[layer] for layer in self.hidden_layers], cache

    def _run_chunk(self, request: EngineRequest, state: _Prefill, count: int) -> torch.Tensor:
        prompt, start, stop = request.prompt, state.done, state.done + count
        if prompt.input_ids is not None:
            inputs = {"input_ids": prompt.input_ids[start:stop][None].to(self.device)}
        else:
            inputs = {"inputs_embeds": prompt.inputs_embeds[start:stop][None].to(self.device)}
        if prompt.position_ids is not None:
            position_ids = prompt.position_ids[..., start:stop].to(self.device)
        else:
            position_ids = self.position_ids_fn(torch.arange(start, stop, device=self.device)[None])
        out = self.model(**inputs, **prompt.model_kwargs, position_ids=position_ids,
                         attention_mask=torch.ones(1, stop, dtype=torch.long, device=self.device),
                         **cache_kwargs(self.model, state.cache), use_cache=True,
                         output_hidden_states=bool(self.hidden_layers))
        for layer in self.hidden_layers:
            state.hidden.setdefault(layer, []).append(out.hidden_states[layer][0])
        state.done = stop
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def decode(self, requests: Sequence[EngineRequest], token_ids: torch.Tensor) -> list[RowOutput]:
        by_id = {r.request_id: (r, t) for r, t in zip(requests, token_ids.tolist())}
        order = self.decoder.cache.request_ids
        if sorted(by_id) != sorted(order):
            raise ValueError("decode() must get exactly the prefilled requests")
        rows = [by_id[rid][0] for rid in order]
        tokens = to_device([by_id[rid][1] for rid in order], torch.long, self.device)
        (logits,) = self.decoder.step(self.embed(tokens), [r.next_position for r in rows])
        for r in rows:
            r.next_position += 1
        result = {rid: RowOutput(logits=logits[i]) for i, rid in enumerate(order)}
        return [result[r.request_id] for r in requests]

    def release(self, request_ids: Sequence[str]) -> None:
        self.decoder.remove(request_ids)

    def reset(self) -> None:
        self.decoder.remove(self.decoder.cache.request_ids)
