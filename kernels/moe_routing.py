"""Router top-k and the expert-sorted token layout of the fused MoE (Triton kernels + PyTorch reference).

`moe_topk_reference` is transformers' Qwen3OmniMoeThinkerTextTopKRouter after its linear (softmax in fp32,
top-k, renormalise, weights cast to the logits' dtype). `moe_route` does the same on the device and sorts the
token-slots (slot = token * top_k + j, the token's j-th expert in ascending id order) by expert into segments
padded to BLOCK_M rows, with a block table giving each BLOCK_M block its expert and its number of real rows:
the layout both grouped GEMMs of `moe.fused_moe` read. Up to 64 tokens this is one program; beyond, three
launches (route per chunk of tokens, one align program over the per-chunk counts, scatter per chunk). Every
buffer is sized from the token count alone (CUDA-graph capturable). The one-launch decode path (`moe_decode`)
routes inside its own programs instead.
"""
from __future__ import annotations

import dataclasses

import torch

from .backend import helper, kernel, round_to, tl, triton

SINGLE_PROGRAM_TOKENS = 64  # up to this many tokens, routing + alignment is one launch
ROUTE_CHUNK = 32  # tokens per routing program beyond that
BLOCK_TABLE_STEP = 32  # block-table entries written per loop step


def moe_topk_reference(router_logits: torch.Tensor, top_k: int, renormalize: bool = True):
    """(weights [T, k] in the logits' dtype, expert ids int64 [T, k]); transformers' TopKRouter after its linear."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


@dataclasses.dataclass
class MoeRouting:
    """The expert-sorted layout shared by both grouped GEMMs (all int32 except weights).

    topk_ids [T, k] (ascending per token), topk_weights [T, k] (the logits' dtype), sorted_slots
    [max_blocks * BLOCK_M] (slot ids t * k + j grouped by expert; only each block's first block_rows
    entries are set), block_expert [max_blocks] (-1 past the last used block), block_rows [max_blocks].
    """
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    sorted_slots: torch.Tensor
    block_expert: torch.Tensor
    block_rows: torch.Tensor
    block_m: int

    @property
    def max_blocks(self) -> int:
        return self.block_expert.shape[0]


@helper
def _topk_mask(probs, e, TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    # top-k of each row by repeated arg-max (lowest expert id on ties); probs is -1 on padded experts
    sel = tl.zeros([BLOCK_T, BLOCK_E], tl.int1)
    vals = probs
    for _ in tl.static_range(TOP_K):
        best = tl.max(vals, axis=1)
        first = tl.min(tl.where(vals == best[:, None], e[None, :], BLOCK_E), axis=1)
        hit = e[None, :] == first[:, None]
        sel = sel | hit
        vals = tl.where(hit, -2.0, vals)
    return sel


@helper
def _write_block_table(counts, e, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M: tl.constexpr,
                       BLOCK_B: tl.constexpr):
    # expert segments padded to BLOCK_M; returns each expert's segment start
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    seg_end = tl.cumsum(padded, axis=0)
    seg_start = seg_end - padded
    total = tl.sum(padded, axis=0)
    for b0 in range(0, max_blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        start = b * BLOCK_M
        expert = tl.sum((seg_end[None, :] <= start[:, None]).to(tl.int32), axis=1)
        mine = e[None, :] == expert[:, None]
        rows = tl.sum(tl.where(mine, counts[None, :] - (start[:, None] - seg_start[None, :]), 0), axis=1)
        used = start < total
        tl.store(block_expert_ptr + b, tl.where(used, expert, -1), mask=b < max_blocks)
        tl.store(block_rows_ptr + b, tl.where(used, tl.minimum(rows, BLOCK_M), 0), mask=b < max_blocks)
    return seg_start


@kernel
def _moe_route_kernel(logits_ptr, ids_ptr, weights_ptr, rank_ptr, counts_ptr, sorted_ptr, block_expert_ptr,
                      block_rows_ptr, T, E, logits_stride, max_blocks, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                      SINGLE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_B: tl.constexpr):
    chunk = tl.program_id(0)
    t = chunk * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.arange(0, BLOCK_E)
    t_ok = t < T
    e_ok = e < E
    logits = tl.load(logits_ptr + t.to(tl.int64)[:, None] * logits_stride + e[None, :],
                     mask=t_ok[:, None] & e_ok[None, :], other=0.0).to(tl.float32)
    logits = tl.where(e_ok[None, :], logits, float("-inf"))
    probs = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = probs / tl.sum(probs, axis=1)[:, None]
    sel = _topk_mask(tl.where(e_ok[None, :], probs, -1.0), e, TOP_K, BLOCK_T, BLOCK_E) & t_ok[:, None]
    weights = probs
    if RENORM:
        weights = probs / tl.where(t_ok, tl.sum(tl.where(sel, probs, 0.0), axis=1), 1.0)[:, None]
    sel_i = sel.to(tl.int32)
    slot = t[:, None] * TOP_K + tl.cumsum(sel_i, axis=1) - 1  # j-th chosen expert in ascending id order
    tl.store(ids_ptr + slot, tl.zeros([BLOCK_T, BLOCK_E], tl.int32) + e[None, :], mask=sel)
    tl.store(weights_ptr + slot, round_to(weights, weights_ptr.dtype.element_ty), mask=sel)
    rank = tl.cumsum(sel_i, axis=0) - 1  # among this chunk's slots of the same expert
    counts = tl.sum(sel_i, axis=0)
    if SINGLE:
        seg_start = _write_block_table(counts, e, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M, BLOCK_B)
        tl.store(sorted_ptr + seg_start[None, :] + rank, slot, mask=sel)
    else:
        tl.store(rank_ptr + slot, rank, mask=sel)
        tl.store(counts_ptr + chunk * BLOCK_E + e, counts)


@kernel
def _moe_align_kernel(counts_ptr, base_ptr, block_expert_ptr, block_rows_ptr, n_chunks, max_blocks,
                      BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr):
    # one program: per-chunk expert counts -> block table and each chunk's first position per expert
    e = tl.arange(0, BLOCK_E)
    c = tl.arange(0, BLOCK_C)
    totals = tl.zeros([BLOCK_E], tl.int32)
    for c0 in range(0, n_chunks, BLOCK_C):
        rows = c0 + c
        totals += tl.sum(tl.load(counts_ptr + rows[:, None] * BLOCK_E + e[None, :], mask=rows[:, None] < n_chunks,
                                 other=0), axis=0)
    running = _write_block_table(totals, e, block_expert_ptr, block_rows_ptr, max_blocks, BLOCK_M, BLOCK_B)
    for c0 in range(0, n_chunks, BLOCK_C):
        rows = c0 + c
        offs = rows[:, None] * BLOCK_E + e[None, :]
        counts = tl.load(counts_ptr + offs, mask=rows[:, None] < n_chunks, other=0)
        tl.store(base_ptr + offs, running[None, :] + tl.cumsum(counts, axis=0) - counts, mask=rows[:, None] < n_chunks)
        running += tl.sum(counts, axis=0)


@kernel
def _moe_scatter_kernel(ids_ptr, rank_ptr, base_ptr, sorted_ptr, num_slots, CHUNK_SLOTS: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr):
    chunk = tl.program_id(0)
    s = chunk * CHUNK_SLOTS + tl.arange(0, BLOCK_S)
    ok = (tl.arange(0, BLOCK_S) < CHUNK_SLOTS) & (s < num_slots)
    expert = tl.load(ids_ptr + s, mask=ok, other=0)
    pos = tl.load(base_ptr + chunk * BLOCK_E + expert, mask=ok, other=0) + tl.load(rank_ptr + s, mask=ok, other=0)
    tl.store(sorted_ptr + pos, s, mask=ok)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool, block_m: int) -> MoeRouting:
    """Routing and expert-sorted alignment on the device (launch 1 of `fused_moe`)."""
    T, E = router_logits.shape
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    dev = router_logits.device
    num_slots = T * top_k
    max_blocks = triton.cdiv(num_slots, block_m) + min(num_slots, E)
    block_e = triton.next_power_of_2(E)
    i32 = dict(dtype=torch.int32, device=dev)
    ids = torch.empty((T, top_k), **i32)
    weights = torch.empty((T, top_k), dtype=router_logits.dtype, device=dev)
    sorted_slots = torch.empty(max_blocks * block_m, **i32)
    block_expert = torch.empty(max_blocks, **i32)
    block_rows = torch.empty(max_blocks, **i32)
    common = dict(TOP_K=top_k, RENORM=bool(renormalize), BLOCK_E=block_e, BLOCK_M=block_m, BLOCK_B=BLOCK_TABLE_STEP)
    if T <= SINGLE_PROGRAM_TOKENS:
        block_t = triton.next_power_of_2(T)
        _moe_route_kernel[(1,)](router_logits, ids, weights, ids, ids, sorted_slots, block_expert, block_rows,
                                T, E, router_logits.stride(0), max_blocks, SINGLE=True, BLOCK_T=block_t,
                                num_warps=4 if block_t <= 16 else 8, **common)
    else:
        n_chunks = triton.cdiv(T, ROUTE_CHUNK)
        rank = torch.empty((T, top_k), **i32)
        counts = torch.empty((n_chunks, block_e), **i32)
        base = torch.empty((n_chunks, block_e), **i32)
        _moe_route_kernel[(n_chunks,)](router_logits, ids, weights, rank, counts, sorted_slots, block_expert,
                                       block_rows, T, E, router_logits.stride(0), max_blocks, SINGLE=False,
                                       BLOCK_T=ROUTE_CHUNK, num_warps=8, **common)
        _moe_align_kernel[(1,)](counts, base, block_expert, block_rows, n_chunks, max_blocks, BLOCK_E=block_e,
                                BLOCK_C=32, BLOCK_M=block_m, BLOCK_B=BLOCK_TABLE_STEP, num_warps=8)
        chunk_slots = ROUTE_CHUNK * top_k
        _moe_scatter_kernel[(n_chunks,)](ids, rank, base, sorted_slots, num_slots, CHUNK_SLOTS=chunk_slots,
                                         BLOCK_S=triton.next_power_of_2(chunk_slots), BLOCK_E=block_e,
                                         num_warps=4)
    return MoeRouting(ids, weights, sorted_slots, block_expert, block_rows, block_m)
