"""A preallocated KV cache with one slot per live request (no per-step allocation or concatenation).

Per layer, keys and values are ONE tensor each, [slots, kv_heads, max_len, head_dim] (transformers'
head-major layout), allocated once. Live requests occupy slots 0..n-1 in join order (compact), so a
decode step of n requests reads `k[:bucket, :, :columns]` — a fixed-shape view that a CUDA graph can
capture and that a batched matmul reads without a copy. A request that leaves
hands its slot to the request in the last slot (one copy of that request's real columns), keeping
the live slots compact; the engine never reorders anything else.

A step writes its new key/value at each row's own column (`write`), so rows of different lengths
share a step; attention masks columns beyond each row's new token. A row
that sits a step out (a talker waiting for text) writes at its next free column without advancing,
so that column is simply overwritten by its next real step.
"""
from __future__ import annotations

import torch

from omni_backends.engine.rows import RequestRows

LayerKV = tuple[torch.Tensor, torch.Tensor]


class StaticKVCache(RequestRows):
    """Slots of per-request KV for a decoder of `layers` layers. Not thread-safe (one engine thread).

    Args:
        layers: decoder layers.
        slots: most requests held at once.
        max_len: most cached tokens per request (prompt + generated).
        kv_heads, head_dim: attention geometry.
        dtype, device: of the cache tensors.

    Raises:
        ValueError: on non-positive sizes.
    """

    def __init__(self, layers: int, slots: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        if min(layers, slots, max_len, kv_heads, head_dim) < 1:
            raise ValueError(f"StaticKVCache sizes must be >= 1, got {layers=} {slots=} {max_len=} "
                             f"{kv_heads=} {head_dim=}")
        self.slots, self.max_len = slots, max_len
        shape = (slots, kv_heads, max_len, head_dim)
        super().__init__()
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    # ---- bookkeeping -------------------------------------------------------------------------
    @property
    def free_slots(self) -> int:
        return self.slots - len(self._ids)

    def slot(self, request_id: str) -> int:
        """Slot of a live request. Raises KeyError when it is not live."""
        return self._row(request_id)

    def lengths(self) -> list[int]:
        """Cached tokens per live slot, in slot order (a copy)."""
        return list(self._lengths)

    # ---- membership --------------------------------------------------------------------------
    def add(self, request_id: str, layers: list[LayerKV]) -> int:
        """Place a prefilled request in the next free slot and return the slot.

        Args:
            layers: per layer (keys, values), each [kv_heads, length, head_dim] or [1, kv_heads, length,
                head_dim] (a transformers cache layer of batch 1), post-RoPE keys.

        Raises:
            ValueError: on a duplicate id, no free slot, a layer-count mismatch or a prompt longer than max_len.
        """
        rows = [(k.reshape(1, -1, *k.shape[-2:]), v.reshape(1, -1, *v.shape[-2:])) for k, v in layers]
        return self.add_rows([request_id], [layers[0][0].shape[-2] if layers else 0], rows)[0]

    def add_rows(self, request_ids: list[str], lengths: list[int], layers: list[LayerKV]) -> list[int]:
        """Place the rows of one right-padded prefill in the next free slots with ONE copy per layer and tensor (a
        burst of 16 prompts: 2 x layers copies instead of 16 x 2 x layers); returns the slots. Each row's columns up
        to the longest length are copied: those past its own length are never attended (a step masks the columns
        past each row's length, as for the stale columns of a refilled slot) and are overwritten as it grows.

        Args:
            request_ids: one per row; lengths: each row's real tokens.
            layers: per layer (keys, values), each [rows, kv_heads, width >= max(lengths), head_dim], post-RoPE keys.

        Raises:
            ValueError: on a duplicate id, too few free slots, a layer-count or row-count mismatch, a length over
                max_len or the layers' width.
        """
        if len(set(request_ids)) != len(request_ids) or any(rid in self._ids for rid in request_ids):
            raise ValueError(f"requests {request_ids!r}: one already holds a KV slot (or is given twice)")
        if len(request_ids) > self.free_slots:
            raise ValueError(f"no free KV slot for {len(request_ids)} requests ({self.free_slots} of {self.slots} free)")
        if len(layers) != len(self.keys):
            raise ValueError(f"expected {len(self.keys)} cache layers, got {len(layers)}")
        if len(lengths) != len(request_ids) or layers[0][0].shape[0] != len(request_ids):
            raise ValueError(f"{len(request_ids)} requests, {len(lengths)} lengths, {layers[0][0].shape[0]} rows")
        width = max(lengths)
        if width > self.max_len:
            raise ValueError(f"prompt of {width} tokens exceeds the KV cache length {self.max_len}")
        if width > layers[0][0].shape[-2] or min(lengths) < 1:
            raise ValueError(f"lengths {lengths} outside the layers' 1..{layers[0][0].shape[-2]} columns")
        first, count = len(self._ids), len(request_ids)
        for index, (k, v) in enumerate(layers):
            self.keys[index][first:first + count, :, :width] = k[:, :, :width]
            self.values[index][first:first + count, :, :width] = v[:, :, :width]
        self._ids += request_ids
        self._lengths += lengths
        return list(range(first, first + count))

    def remove(self, request_ids: list[str]) -> None:
        """Free the slots of these requests (unknown ids are ignored), refilling holes from the last slot."""
        for rid in request_ids:
            if rid not in self._ids:
                continue
            hole, last = self._ids.index(rid), len(self._ids) - 1
            if hole != last:
                n = self._lengths[last]
                for cache in (*self.keys, *self.values):
                    cache[hole, :, :n] = cache[last, :, :n]
                self._ids[hole], self._lengths[hole] = self._ids[last], self._lengths[last]
            self._ids.pop()
            self._lengths.pop()

    def advance(self, active: list[bool] | None = None) -> None:
        """Record that a step appended one token to every live request (or to those where `active[slot]`).

        Raises:
            RuntimeError: when a request would exceed max_len.
        """
        grown = [n + (1 if active is None or active[i] else 0) for i, n in enumerate(self._lengths)]
        if any(n > self.max_len for n in grown):
            raise RuntimeError(f"a request exceeds the KV cache length {self.max_len}")
        self._lengths = grown

    # ---- step tensors ------------------------------------------------------------------------
    def step_columns(self, rows: int, extra: int = 1) -> int:
        """Columns a step over the first `rows` slots must attend: the longest row + `extra`."""
        return max(self._lengths[:rows], default=0) + extra

    @staticmethod
    def write(cache: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor, new: torch.Tensor) -> None:
        """cache[rows[i], :, columns[i]] = new[i] for every i (new: [B, kv_heads, head_dim]); capturable."""
        cache[rows, :, columns] = new
