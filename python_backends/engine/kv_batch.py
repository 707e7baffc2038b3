"""Continuous batching over per-request KV caches of transformers decoder models.

A `KVBatch` holds the KV caches of all live requests as ONE left-padded transformers `DynamicCache`
(layers of keys/values float [rows, kv_heads, width, head_dim]) plus each row's real length, so one
decode forward serves every live request. Requests join with the cache of their own prefill (batch 1)
and leave at any step; only then is the batch re-laid out (rows added, left-padded to the widest row,
or rows dropped and all-padding leading columns trimmed). Between membership changes a decode step
costs no extra copy beyond `DynamicCache`'s own append.

Padding columns hold zeros and are masked out by `attention_mask`; positions are not derived from
columns, so callers pass per-request position ids themselves.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from omni_backends.engine.rows import RequestRows

LayerKV = tuple[torch.Tensor, torch.Tensor]


def cache_layers(cache: DynamicCache, row: int = 0, length: int | None = None) -> list[LayerKV]:
    """Keys/values of one row of a right-padded cache, e.g. after a batched prefill.

    Args:
        cache: a DynamicCache whose layers are all full-attention `DynamicLayer`s.
        row: the batch row to take.
        length: keep the first `length` columns (the row's real tokens); None keeps all.

    Returns:
        Per layer (keys, values), each float [1, kv_heads, length, head_dim].

    Raises:
        ValueError: when a layer is not a plain `DynamicLayer` (sliding-window, linear-attention and
            quantized caches are not supported).
    """
    out = []
    for index, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"KVBatch supports full-attention DynamicLayer caches only; layer {index} is {type(layer).__name__}"
            )
        stop = layer.keys.shape[-2] if length is None else length
        out.append((layer.keys[row : row + 1, :, :stop], layer.values[row : row + 1, :, :stop]))
    return out


class KVBatch(RequestRows):
    """Left-padded batch of per-request KV caches; rows are ordered as `request_ids`.

    Not thread-safe: one engine thread owns it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._layers: list[LayerKV] = []  # each float [rows, kv_heads, width, head_dim]
        self._cache: DynamicCache | None = None

    @property
    def width(self) -> int:
        """Cached columns per row (the longest row's length); 0 when empty."""
        return max(self._lengths, default=0)

    def add(self, entries: list[tuple[str, list[LayerKV]]]) -> None:
        """Join requests with their own caches.

        Args:
            entries: (request_id, layers) pairs; layers as returned by `cache_layers`, each tensor
                [1, kv_heads, length, head_dim], same layer count, heads, dtype and device as the batch.

        Raises:
            ValueError: on a request id already in the batch or a layer-count mismatch.
        """
        if not entries:
            return
        self._sync_from_cache()
        new_ids = [rid for rid, _ in entries]
        if len(set(new_ids)) != len(new_ids) or any(rid in self._ids for rid in new_ids):
            raise ValueError(f"request ids already in the KV batch: {new_ids}")
        n_layers = len(entries[0][1]) if not self._layers else len(self._layers)
        if any(len(layers) != n_layers for _, layers in entries):
            raise ValueError(f"every cache must have {n_layers} layers")
        lengths = [layers[0][0].shape[-2] for _, layers in entries]
        width = max([self.width, *lengths])
        stacked = []
        for index in range(n_layers):
            keys = [_left_pad(layers[index][0], width) for _, layers in entries]
            values = [_left_pad(layers[index][1], width) for _, layers in entries]
            if self._layers:
                keys.insert(0, _left_pad(self._layers[index][0], width))
                values.insert(0, _left_pad(self._layers[index][1], width))
            stacked.append((torch.cat(keys, 0), torch.cat(values, 0)))
        self._ids += new_ids
        self._lengths += lengths
        self._set_layers(stacked)

    def remove(self, request_ids: list[str]) -> None:
        """Drop requests (ids not in the batch are ignored) and trim all-padding leading columns."""
        drop = set(request_ids) & set(self._ids)
        if not drop:
            return
        self._sync_from_cache()
        keep = [row for row, rid in enumerate(self._ids) if rid not in drop]
        self._ids = [self._ids[row] for row in keep]
        self._lengths = [self._lengths[row] for row in keep]
        if not keep:
            self._set_layers([])
            return
        rows = torch.tensor(keep, device=self._layers[0][0].device)
        start = self._layers[0][0].shape[-2] - self.width
        self._set_layers(
            [(k.index_select(0, rows)[:, :, start:], v.index_select(0, rows)[:, :, start:]) for k, v in self._layers]
        )

    def step_inputs(self, query_length: int = 1) -> tuple[DynamicCache, torch.Tensor]:
        """Cache and attention mask for a forward that appends `query_length` tokens to every row.

        Returns:
            (cache, attention_mask): the batch DynamicCache (the forward updates it in place) and an
            int64 mask [rows, width + query_length], 0 on left padding, 1 elsewhere.

        Raises:
            RuntimeError: when the batch is empty.
        """
        if not self._ids:
            raise RuntimeError("step_inputs() on an empty KVBatch")
        device = self._layers[0][0].device
        total = self.width + query_length
        lengths = torch.tensor(self._lengths, device=device) + query_length
        mask = (torch.arange(total, device=device)[None, :] >= (total - lengths)[:, None]).long()
        return self._cache, mask

    def advance(self, query_length: int = 1) -> None:
        """Record that a forward appended `query_length` tokens to every row.

        Raises:
            RuntimeError: when the cache did not grow by exactly `query_length` columns.
        """
        grown = self._cache.layers[0].keys.shape[-2] - self.width
        if grown != query_length:
            raise RuntimeError(f"the forward appended {grown} cache columns, expected {query_length}")
        self._lengths = [n + query_length for n in self._lengths]

    def _set_layers(self, layers: list[LayerKV]) -> None:
        self._layers = layers
        self._cache = DynamicCache(ddp_cache_data=layers) if layers else None

    def _sync_from_cache(self) -> None:
        """Pick up the tensors a forward wrote into the DynamicCache since the last re-layout."""
        if self._cache is not None:
            self._layers = [(layer.keys, layer.values) for layer in self._cache.layers]


def _left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad dim -2 on the left to `width` columns."""
    missing = width - tensor.shape[-2]
    if missing == 0:
        return tensor
    pad = tensor.new_zeros(*tensor.shape[:-2], missing, tensor.shape[-1])
    return torch.cat([pad, tensor], dim=-2)
