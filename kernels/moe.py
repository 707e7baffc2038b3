"""Fused mixture-of-experts for Qwen3-Omni's sparse blocks (Triton kernels + PyTorch reference).

`fused_moe(hidden, router_logits, w13, w2, top_k)` equals transformers' Qwen3OmniMoeThinkerTextTopKRouter
(softmax in fp32, top-k, renormalise, weights cast to the logits' dtype) followed by
Qwen3OmniMoeThinkerTextExperts (gate_up_proj [E, 2I, H] gate rows first, SiLU(gate) * up, down_proj
[E, H, I], times the routing weight, summed over the token's experts in ascending expert order). The
talker's routed experts are the same computation with top-6 (its shared expert stays outside).

Two paths, chosen per token count by the config table (`moe_configs.moe_config`):
- decode (the fewest tokens): ONE launch, `moe_decode` (routing, gate_up, SiLU-mul, split-K down and the top-k
  sum in each program; fp32 atomics).
- grouped (all sizes depend on the token count only, so the sequence is CUDA-graph capturable):
 1. route + align (`moe_routing.moe_route`): softmax/top-k per token, then the token-slots (slot = token *
    top_k + j) sorted by expert into segments padded to BLOCK_M rows, with a block table.
 2. gate_up grouped GEMM: per (block, BLOCK_N columns) program, X[tokens of the block] @ W13[e]^T for the
    gate and up halves into two fp32 accumulators; epilogue SiLU(gate) * up -> bf16 [slots, I].
 3. down grouped GEMM: [slots, I] @ W2[e]^T in fp32; epilogue times the routing weight -> bf16 [slots, H].
 4. top-k reduction: each token's top_k slot rows summed in ascending expert order -> [T, H].
 The epilogues round to the activation dtype where transformers' unfused code does (each linear's output,
 silu's output, each product, each partial sum), so the outputs differ from the reference only by the GEMMs'
 fp32 summation order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import DOT_IN_FP32, dot_step, helper, kernel, round_to, rounded, select, tl, triton
from .moe_configs import DecodeConfig, GemmConfig, MoeConfig, moe_config
from .moe_decode import fused_moe_decode
from .moe_routing import MoeRouting, moe_route, moe_topk_reference
from .norm import rms_norm, rms_norm_reference
from .splitk import SplitKWorkspace


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
        k_ok = (k < K - k0) | EVEN_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc_g = dot_step(a, g_ptrs, k_ok[:, None] & n_ok[None, :], acc_g, DOT_F32, DOT_PRECISION)
        acc_u = dot_step(a, u_ptrs, k_ok[:, None] & n_ok[None, :], acc_u, DOT_F32, DOT_PRECISION)
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
        k_ok = (k < K - k0) | EVEN_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = dot_step(a, w_ptrs, k_ok[:, None] & n_ok[None, :], acc, DOT_F32, DOT_PRECISION)
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
              renormalize: bool = True, config: MoeConfig | DecodeConfig | None = None,
              workspace: SplitKWorkspace | None = None, residual: torch.Tensor | None = None,
              norm_weight: torch.Tensor | None = None, eps: float = 1e-6):
    """Routed experts of a Qwen3-Omni sparse MoE block, optionally followed by the decoder's residual add and
    next RMSNorm.

    hidden: [T, H] bf16/fp16/fp32; router_logits: [T, E] (the gate linear's output, any float dtype);
    w13: [E, 2I, H] (transformers' `gate_up_proj`, gate rows first), w2: [E, H, I] (`down_proj`), both in
    hidden's dtype with a contiguous last dim; top_k: experts per token (thinker 8, talker 6);
    renormalize: divide the top-k probabilities by their sum (`norm_topk_prob`). config: the path and its block
    sizes (default: `moe_configs.moe_config(T, H, I)`, tuned per expert shape: a `DecodeConfig` runs the
    one-launch decode path, a `MoeConfig` the grouped one). workspace: the decode path's zeroed accumulator
    (`SplitKWorkspace(max_tokens, H, device)`, reused call after call on one stream; default: a new one per call).
    norm_weight [H] (hidden's dtype), eps, residual [T, H] (optional): return what
    `rms_norm(out, norm_weight, eps, residual)` returns for the MoE output `out` (the decode path does it in
    its last program). Returns [T, H] in hidden's dtype (or that norm's result). Raises ValueError on mismatched
    shapes/dtypes or a workspace that does not fit. Source: transformers Qwen3OmniMoeThinkerTextSparseMoeBlock
    (router + experts) and the decoder layer's residual add + Qwen3OmniMoeThinkerTextRMSNorm.
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
        out = fused_moe_reference(hidden, router_logits, w13, w2, top_k, renormalize)
        return out if norm_weight is None else rms_norm_reference(out, norm_weight, eps, residual)
    if w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_moe: expert weights need a contiguous last dim")
    config = config or moe_config(T, H, two_i // 2)
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    if isinstance(config, DecodeConfig):
        return fused_moe_decode(hidden, router_logits, w13, w2, top_k, renormalize, config, workspace, residual,
                                norm_weight, eps)
    routing = moe_route(router_logits, top_k, renormalize, config.BLOCK_M)
    inter = moe_gate_up(hidden, w13, routing, config.gate_up)
    out = moe_sum(moe_down(inter, w2, routing, config.down), top_k)
    return out if norm_weight is None else rms_norm(out, norm_weight, eps, residual)
