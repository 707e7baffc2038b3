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
        if request_id in self._ids:
            raise ValueError(f"request {request_id!r} already holds a KV slot")
        if not self.free_slots:
            raise ValueError(f"no free KV slot (all {self.slots} in use)")
        if len(layers) != len(self.keys):
            raise ValueError(f"expected {len(self.keys)} cache layers, got {len(layers)}")
        length = layers[0][0].shape[-2]
        if length > self.max_len:
            raise ValueError(f"prompt of {length} tokens exceeds the KV cache length {self.max_len}")
        slot = len(self._ids)
        for index, (k, v) in enumerate(layers):
            self.keys[index][slot, :, :length] = k.reshape(-1, *k.shape[-2:])
            self.values[index][slot, :, :length] = v.reshape(-1, *v.shape[-2:])
        self._ids.append(request_id)
        self._lengths.append(length)
        return slot

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
