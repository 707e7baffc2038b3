"""Fused mixture-of-experts for Qwen3-Omni's sparse blocks (Triton kernels + PyTorch reference).

`fused_moe(hidden, router_logits, w13, w2, top_k)` equals transformers' Qwen3OmniMoeThinkerTextTopKRouter
(softmax in fp32, top-k, renormalise, weights cast to the logits' dtype) followed by
Qwen3OmniMoeThinkerTextExperts (gate_up_proj [E, 2I, H] gate rows first, SiLU(gate) * up, down_proj
[E, H, I], times the routing weight, summed over the token's experts in ascending expert order). The
talker's routed experts are the same computation with top-6 (its shared expert stays outside).

Launches (all sizes depend on the token count only, so the sequence is CUDA-graph capturable):
 1. route + align: softmax/top-k per token, then the token-slots (slot = token * top_k + j) are sorted by
    expert into segments padded to BLOCK_M rows; a block table gives each BLOCK_M block its expert and
    its number of real rows. Up to 64 tokens this is one program; beyond, three launches (route per chunk
    of tokens, one align program over the per-chunk counts, scatter per chunk).
 2. gate_up grouped GEMM: per (block, BLOCK_N columns) program, X[tokens of the block] @ W13[e]^T for the
    gate and up halves into two fp32 accumulators; epilogue SiLU(gate) * up -> bf16 [slots, I].
 3. down grouped GEMM: [slots, I] @ W2[e]^T in fp32; epilogue times the routing weight -> bf16 [slots, H].
 4. top-k reduction: each token's top_k slot rows summed in ascending expert order -> [T, H].
The epilogues round to the activation dtype where transformers' unfused code does (each linear's output,
silu's output, each product, each partial sum), so the kernels' outputs differ from the reference only by
the GEMMs' fp32 summation order.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .backend import DOT_IN_FP32, helper, kernel, round_to, rounded, select, tl, triton
from .moe_configs import GemmConfig, MoeConfig, moe_config

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


def fused_moe_reference(hidden: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        top_k: int, renormalize: bool = True) -> torch.Tensor:
    """PyTorch reference of `fused_moe`: expert by expert, in ascending expert order."""
    weights, ids = moe_topk_reference(router_logits, top_k, renormalize)
    out = torch.zeros_like(hidden)
    for expert in torch.unique(ids).tolist():
        pos, tok = torch.where(ids.T == expert)
        gate, up = F.linear(hidden[tok], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert]) * weights[tok, pos, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


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


@helper
def _grouped_pid(pid, num_m, num_n, GROUP_M: tl.constexpr):
    # GROUP_M row blocks share each column sweep, so consecutive programs reuse weight tiles from L2
    width = GROUP_M * num_n
    first_m = pid // width * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@helper
def _block_of_program(block_expert_ptr, block_rows_ptr, sorted_ptr, num_blocks, N, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    # this program's row block: its expert (-1: unused block), slot ids (int64) and row mask, and columns
    pid_m, pid_n = _grouped_pid(tl.program_id(0), num_blocks, tl.cdiv(N, BLOCK_N), GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < tl.load(block_rows_ptr + pid_m)
    slot = tl.load(sorted_ptr + pid_m * BLOCK_M + m, mask=m_ok, other=0).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return expert, slot, m_ok, n, n < N


@kernel
def _moe_gate_up_kernel(x_ptr, w_ptr, out_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, N, K, num_blocks,
                        x_stride, w_stride_e, w_stride_n, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                        DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # out[slot, n] = silu(x[tok] . W13[e, n]) * (x[tok] . W13[e, N + n]) for the slots of one expert block
    expert, slot, m_ok, n, n_ok = _block_of_program(block_expert_ptr, block_rows_ptr, sorted_ptr, num_blocks, N,
                                                    BLOCK_M, BLOCK_N, GROUP_M)
    if expert < 0:
        return
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + (slot // TOP_K)[:, None] * x_stride + k[None, :]
    g_ptrs = w_ptr + expert.to(tl.int64) * w_stride_e + n[None, :] * w_stride_n + k[:, None]
    u_ptrs = g_ptrs + N * w_stride_n
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            g = tl.load(g_ptrs, mask=n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = k < K - k0
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_F32:
            a, g, u = a.to(tl.float32), g.to(tl.float32), u.to(tl.float32)
        acc_g = tl.dot(a, g, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, u, acc_u, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dt = out_ptr.dtype.element_ty
    gate = rounded(acc_g, dt)
    out = round_to(rounded(gate * tl.sigmoid(gate), dt) * rounded(acc_u, dt), dt)
    tl.store(out_ptr + slot[:, None] * N + n[None, :], out, mask=m_ok[:, None] & n_ok[None, :])


@kernel
def _moe_down_kernel(a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, block_expert_ptr, block_rows_ptr, N, K,
                     num_blocks, w_stride_e, w_stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, DOT_F32: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    # out[slot, n] = weight[slot] * (a[slot] . W2[e, n]) for the slots of one expert block
    expert, slot, m_ok, n, n_ok = _block_of_program(block_expert_ptr, block_rows_ptr, sorted_ptr, num_blocks, N,
                                                    BLOCK_M, BLOCK_N, GROUP_M)
    if expert < 0:
        return
    k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + slot[:, None] * K + k[None, :]
    w_ptrs = w_ptr + expert.to(tl.int64) * w_stride_e + n[None, :] * w_stride_n + k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            k_ok = k < K - k0
            a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_F32:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dt = out_ptr.dtype.element_ty
    route_w = tl.load(weights_ptr + slot, mask=m_ok, other=0.0).to(tl.float32)
    out = round_to(rounded(acc, dt) * route_w[:, None], dt)
    tl.store(out_ptr + slot[:, None] * N + n[None, :], out, mask=m_ok[:, None] & n_ok[None, :])


@kernel
def _moe_sum_kernel(y_ptr, out_ptr, T, H, TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    # out[t] = sum of the token's top_k slot rows, rounded after each add as index_add_ in the dtype does
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (t[:, None] < T) & (cols[None, :] < H)
    rows = t.to(tl.int64)[:, None] * TOP_K
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
    for j in tl.static_range(TOP_K):
        acc = rounded(acc + tl.load(y_ptr + (rows + j) * H + cols[None, :], mask=mask, other=0.0).to(tl.float32), dt)
    tl.store(out_ptr + t.to(tl.int64)[:, None] * H + cols[None, :], acc.to(dt), mask=mask)


SHARED_MEMORY_BUDGET = 200 * 1024  # of the H100/H200's 227 KB per block


def fit_stages(config: GemmConfig, block_m: int, b_tiles: int, dtype: torch.dtype) -> int:
    """The config's pipelining depth, lowered until its shared-memory ring (A tile + b_tiles B tiles per
    stage) fits the budget; the table is sized for bf16, fp32 inputs need about half the stages."""
    per_stage = (block_m + b_tiles * config.BLOCK_N) * config.BLOCK_K * torch.tensor([], dtype=dtype).element_size()
    return max(1, min(config.num_stages, SHARED_MEMORY_BUDGET // per_stage))


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 experts multiply in full fp32 ("ieee"), as torch's default matmul does; bf16/fp16 ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def moe_gate_up(hidden: torch.Tensor, w13: torch.Tensor, routing: MoeRouting, config: GemmConfig) -> torch.Tensor:
    """Launch 2: hidden [T, H], w13 [E, 2I, H] -> SiLU(gate) * up per slot, [T * top_k, I] in hidden's dtype."""
    T, H = hidden.shape
    top_k = routing.topk_ids.shape[1]
    inter = w13.shape[1] // 2
    out = torch.empty((T * top_k, inter), dtype=hidden.dtype, device=hidden.device)
    grid = (routing.max_blocks * triton.cdiv(inter, config.BLOCK_N),)
    _moe_gate_up_kernel[grid](hidden, w13, out, routing.sorted_slots, routing.block_expert, routing.block_rows, inter,
                              H, routing.max_blocks, hidden.stride(0), w13.stride(0), w13.stride(1), TOP_K=top_k,
                              BLOCK_M=routing.block_m, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
                              GROUP_M=config.GROUP_M, EVEN_K=H % config.BLOCK_K == 0, DOT_F32=DOT_IN_FP32,
                              DOT_PRECISION=_dot_precision(hidden.dtype), num_warps=config.num_warps,
                              num_stages=fit_stages(config, routing.block_m, 2, hidden.dtype))
    return out


def moe_down(inter: torch.Tensor, w2: torch.Tensor, routing: MoeRouting, config: GemmConfig) -> torch.Tensor:
    """Launch 3: [T * top_k, I] -> routing weight * (x @ W2[e]^T) per slot, [T * top_k, H]."""
    hidden_size, K = w2.shape[1], w2.shape[2]
    out = torch.empty((inter.shape[0], hidden_size), dtype=inter.dtype, device=inter.device)
    grid = (routing.max_blocks * triton.cdiv(hidden_size, config.BLOCK_N),)
    _moe_down_kernel[grid](inter, w2, out, routing.topk_weights, routing.sorted_slots, routing.block_expert,
                           routing.block_rows, hidden_size, K, routing.max_blocks, w2.stride(0), w2.stride(1),
                           BLOCK_M=routing.block_m, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
                           GROUP_M=config.GROUP_M, EVEN_K=K % config.BLOCK_K == 0, DOT_F32=DOT_IN_FP32,
                           DOT_PRECISION=_dot_precision(inter.dtype),
                           num_warps=config.num_warps, num_stages=fit_stages(config, routing.block_m, 1, inter.dtype))
    return out


def moe_sum(slots_out: torch.Tensor, top_k: int) -> torch.Tensor:
    """Launch 4: [T * top_k, H] -> [T, H], each token's slots summed in ascending expert order."""
    H = slots_out.shape[1]
    T = slots_out.shape[0] // top_k
    out = torch.empty((T, H), dtype=slots_out.dtype, device=slots_out.device)
    block_h = min(1024, triton.next_power_of_2(H))
    block_t = max(1, min(triton.next_power_of_2(T), 2048 // block_h))
    grid = (triton.cdiv(T, block_t), triton.cdiv(H, block_h))
    _moe_sum_kernel[grid](slots_out, out, T, H, TOP_K=top_k, BLOCK_T=block_t, BLOCK_H=block_h,
                          num_warps=max(1, block_t * block_h // 256))
    return out


def fused_moe(hidden: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
              renormalize: bool = True, config: MoeConfig | None = None) -> torch.Tensor:
    """Routed experts of a Qwen3-Omni sparse MoE block.

    hidden: [T, H] bf16/fp16/fp32; router_logits: [T, E] (the gate linear's output, any float dtype);
    w13: [E, 2I, H] (transformers' `gate_up_proj`, gate rows first), w2: [E, H, I] (`down_proj`), both in
    hidden's dtype with a contiguous last dim; top_k: experts per token (thinker 8, talker 6);
    renormalize: divide the top-k probabilities by their sum (`norm_topk_prob`). config: block sizes
    (default: `moe_configs.moe_config(T, H, I)`, tuned per expert shape). Returns [T, H] in hidden's dtype.
    Raises ValueError on mismatched shapes/dtypes. Source: transformers Qwen3OmniMoeThinkerTextSparseMoeBlock (router + experts).
    """
    ok = hidden.dim() == 2 and w13.dim() == 3
    if ok:
        (T, H), (E, two_i, H_w) = hidden.shape, w13.shape
        ok = router_logits.shape == (T, E) and H_w == H and two_i % 2 == 0 and w2.shape == (E, H, two_i // 2)
        ok = ok and 0 < top_k <= E and w13.dtype == w2.dtype == hidden.dtype
    if not ok:
        raise ValueError(f"fused_moe: hidden {tuple(hidden.shape)} {hidden.dtype}, router_logits "
                         f"{tuple(router_logits.shape)}, w13 {tuple(w13.shape)} {w13.dtype}, w2 {tuple(w2.shape)} "
                         f"{w2.dtype}, top_k {top_k}")
    backend = select("fused_moe", hidden, router_logits, w13, w2)
    if backend == "reference" or T == 0:
        return fused_moe_reference(hidden, router_logits, w13, w2, top_k, renormalize)
    if w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_moe: expert weights need a contiguous last dim")
    config = config or moe_config(T, H, two_i // 2)
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    routing = moe_route(router_logits, top_k, renormalize, config.BLOCK_M)
    inter = moe_gate_up(hidden, w13, routing, config.gate_up)
    return moe_sum(moe_down(inter, w2, routing, config.down), top_k)
