"""Greedy pick and embedding lookup in one launch (Triton kernel + PyTorch reference).

Each inner step of the code predictor's frame ends with `code = logits.argmax(-1)` and the next step's input
`embedding(code)`: two launches (a reduction and an index select) that at 16 rows cost ~10 us each on the H200
(run 29's profile: torch's bf16 arg-max reduction and `indexSelectSmallIndex`, 30 launches and ~0.3 ms per frame).
Here one program per row finds the row's arg-max and copies that row of the embedding table.

Numerics: exact (no arithmetic). Ties go to the lowest index and a NaN counts as larger than any number (the
first NaN wins), as `torch.argmax` does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import grid_dependency, kernel, pdl_for, select, tl, triton

MAX_VOCAB = 16384   # one row of logits lives in registers; wider rows use the reference


def greedy_embedding_reference(logits: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch reference of `greedy_embedding` (same arguments and results)."""
    codes = logits.argmax(-1)
    return codes, F.embedding(codes, table)


@kernel
def _greedy_embedding_kernel(logits_ptr, table_ptr, codes_ptr, out_ptr, V, H, logits_stride, table_stride,
                             BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    grid_dependency(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_V)
    ok = cols < V
    x = tl.load(logits_ptr + row * logits_stride + cols, mask=ok, other=float("-inf")).to(tl.float32)
    nan = (x != x) & ok
    first_nan = tl.min(tl.where(nan, cols, BLOCK_V), axis=0)
    best = tl.argmax(tl.where(nan, float("-inf"), x), axis=0, tie_break_left=True)
    code = tl.where(first_nan < BLOCK_V, first_nan, best).to(tl.int64)
    tl.store(codes_ptr + row, code)
    h = tl.arange(0, BLOCK_H)
    for h0 in range(0, H, BLOCK_H):
        keep = h0 + h < H
        tl.store(out_ptr + row * H + h0 + h, tl.load(table_ptr + code * table_stride + h0 + h, mask=keep), mask=keep)


def greedy_embedding(logits: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(logits.argmax(-1), F.embedding(that, table))` for logits [B, V] (any float dtype, last dim contiguous) and
    an embedding table [N >= V, H]: codes int64 [B] and rows [B, H] in the table's dtype, one launch.
    Raises ValueError on shapes that do not fit (not 2-D, or a table with fewer rows than V)."""
    if logits.dim() != 2 or table.dim() != 2 or table.shape[0] < logits.shape[1]:
        raise ValueError(f"greedy_embedding: logits {tuple(logits.shape)}, table {tuple(table.shape)} (logits [B, V], "
                         f"table [N >= V, H])")
    backend = select("greedy_embedding", logits, table)
    (B, V), H = logits.shape, table.shape[1]
    if backend == "reference" or V > MAX_VOCAB or B == 0:
        return greedy_embedding_reference(logits, table)
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    table = table if table.stride(-1) == 1 else table.contiguous()
    codes = torch.empty(B, dtype=torch.long, device=logits.device)
    out = torch.empty(B, H, dtype=table.dtype, device=table.device)
    block_v = triton.next_power_of_2(V)
    pdl = pdl_for(logits.device, B)
    _greedy_embedding_kernel[(B,)](logits, table, codes, out, V, H, logits.stride(0), table.stride(0), BLOCK_V=block_v,
                                   BLOCK_H=min(1024, triton.next_power_of_2(H)), PDL=pdl, launch_pdl=pdl,
                                   num_warps=max(1, min(8, block_v // 256)))
    return codes, out
