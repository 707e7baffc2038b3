"""One-launch fused MoE for decode (a few tokens): routing, gate_up, SiLU-mul, down and the top-k sum in ONE kernel.

At one token the grouped path of `moe.fused_moe` is four launches (route + align, gate_up GEMM, down GEMM,
top-k sum) around ~24 us of weight streaming (thinker: 8 experts x 9.4 MB); the launch tails and the
single-program routing cost ~8 us of its ~31 us (57% of the copy bandwidth, H200 runs 3-5). Here every
program owns one token-slot (slot = token * top_k + j, the token's j-th expert by probability) and BLOCK_N
columns of the expert's intermediate dim I:
  1. it routes its token itself (softmax over the E logits, one bitonic top-k, renormalise: `_slot_route`);
  2. gate/up: the token's row as a 16-row MMA tile against the BLOCK_N gate rows and up rows of W13[e],
     BLOCK_K steps pipelined as async copies; SiLU(gate) * up in registers, rounded where transformers'
     unfused code rounds (each linear's output, silu's output, the product);
  3. split-K down: those BLOCK_N intermediate values times the matching BLOCK_N columns of W2[e] give a partial
     [H] row, times the routing weight, added into an fp32 accumulator [T, H] with relaxed atomics (the sum
     over I-chunks and over the token's experts in one place);
  4. the last program to finish converts the accumulator to the output dtype and, when asked, adds the residual
     and applies the next RMSNorm (`splitk._finish_rows`: the decoder's next input norm costs no launch).
With `backend.set_prefetch(True)` (and PDL) each program first asks L2 for its W2 columns of step 3, so they stream
from HBM during step 2. So the intermediate [slots, I] and the per-slot rows [slots, H] never reach memory, and the weights are
streamed by T * top_k * I / BLOCK_N programs at once (thinker, one token, BLOCK_N 64: 96; H200 runs 8-10:
31.7 -> 25.3-26.0 us, 56% -> 69-71% of the copy bandwidth).

Numerics: the down products are summed in fp32 over I-chunks and experts and rounded once, where the reference
rounds each expert's down output, its weighted row and each partial sum to the activation dtype: the results
agree to bf16 rounding (relative error ~2-5e-3), and the fp32 atomics make the last bits of bf16 outputs vary
between runs (the order of the adds). The grouped path stays bit-stable; it is used past `decode_tokens`.

The accumulator and counter live in a `splitk.SplitKWorkspace` [T, H] that the launch leaves zeroed: one per
call site (the engine keeps one per MoE layer, so graphs of different engines on different streams never share
one); without one, each call allocates a zeroed workspace (one memset).
"""
from __future__ import annotations

import dataclasses

import torch

from .backend import (DOT_IN_FP32, dot_step, grid_dependency, helper, kernel, pdl_for, prefetch, prefetch_l2, rounded,
                      tl, triton)
from .moe_configs import DecodeConfig
from .splitk import SplitKWorkspace, _finish_rows, finish_block, finish_outputs, finish_rows, norm_args, workspace_for

@helper
def _slot_route(logits_ptr, t, logits_stride, E, j, TOP_K: tl.constexpr, TOP_K_POW2: tl.constexpr,
                RENORM: tl.constexpr, BLOCK_E: tl.constexpr):
    # token t's expert of rank j (0 = highest probability; ties: lower id first) and its routing weight (fp32,
    # rounded to the logits' dtype). One bitonic top-k over int64 keys (probability bits above the inverted
    # expert id: probabilities are >= 0, so their bits order like the values) instead of top_k rounds of
    # arg-max, each two block-wide reductions, on every program's critical path.
    e = tl.arange(0, BLOCK_E)
    e_ok = e < E
    logits = tl.load(logits_ptr + t * logits_stride + e, mask=e_ok, other=float("-inf")).to(tl.float32)
    p = tl.exp(logits - tl.max(logits, axis=0))
    p = p / tl.sum(p, axis=0)   # padded experts: exactly 0, and the highest ids, so never ahead of a real one
    keys = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - e).to(tl.int64)
    top = tl.topk(keys, TOP_K_POW2)
    rank = tl.arange(0, TOP_K_POW2)
    key = tl.sum(tl.where(rank == j, top, 0), axis=0)
    weight = (key >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    if RENORM:
        probs = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        weight = weight / tl.sum(tl.where(rank < TOP_K, probs, 0.0), axis=0)
    expert = BLOCK_E - 1 - (key & 0xFFFFFFFF)
    return expert, rounded(weight, logits_ptr.dtype.element_ty)


@kernel
def _moe_decode_kernel(x_ptr, logits_ptr, w13_ptr, w2_ptr, out_ptr, acc_ptr, count_ptr, res_ptr, sum_ptr, norm_ptr,
                       eps, T, E, H, I, x_stride, logits_stride, w13_stride_e, w13_stride_n, w2_stride_e, w2_stride_h,
                       TOP_K: tl.constexpr, TOP_K_POW2: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr,
                       EVEN_K: tl.constexpr, EVEN_H: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr,
                       PDL: tl.constexpr, PREFETCH: tl.constexpr):
    dt = out_ptr.dtype.element_ty
    grid_dependency(PDL)   # the logits and hidden rows come from the launches before
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(I, BLOCK_N)
    slot = pid // n_blocks
    t = slot // TOP_K
    # 1. the token's routing (every program of the token recomputes it from the E logits)
    expert, route_w = _slot_route(logits_ptr, t, logits_stride, E, slot % TOP_K, TOP_K, TOP_K_POW2, RENORM, BLOCK_E)
    # 2. gate/up GEMV for BLOCK_N columns of I, SiLU-mul epilogue
    n = (pid % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    if PREFETCH:   # the W2 columns of step 3 into L2 while gate/up streams (they depend on the expert only)
        rows = tl.minimum(tl.arange(0, BLOCK_W), H - 1)
        prefetch_l2(w2_ptr + expert * w2_stride_e + rows * w2_stride_h + (pid % n_blocks) * BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    m = tl.arange(0, 16)   # the token's row padded to a 16-row MMA tile: the loads become async-copy stages
    a_ptrs = x_ptr + t.to(tl.int64) * x_stride + m[:, None] * 0 + k[None, :]
    g_ptrs = w13_ptr + expert * w13_stride_e + n[None, :] * w13_stride_n + k[:, None]
    u_ptrs = g_ptrs + I * w13_stride_n
    acc_g = tl.zeros([16, BLOCK_N], tl.float32)
    acc_u = tl.zeros([16, BLOCK_N], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_ok = (k < H - k0) | EVEN_K
        a = tl.load(a_ptrs, mask=(m[:, None] == 0) & k_ok[None, :], other=0.0)
        acc_g = dot_step(a, g_ptrs, k_ok[:, None] & n_ok[None, :], acc_g, DOT_F32, DOT_PRECISION)
        acc_u = dot_step(a, u_ptrs, k_ok[:, None] & n_ok[None, :], acc_u, DOT_F32, DOT_PRECISION)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    gate = tl.sum(tl.where(m[:, None] == 0, acc_g, 0.0), axis=0)   # row 0 of the padded tile
    up = tl.sum(tl.where(m[:, None] == 0, acc_u, 0.0), axis=0)
    gate = rounded(gate, dt)
    inter = tl.where(n_ok, rounded(rounded(gate * tl.sigmoid(gate), dt) * rounded(up, dt), dt), 0.0)
    # 3. split-K down: W2[e][:, n] . inter for every hidden row, times the routing weight, into the token's
    #    fp32 accumulator row
    h = tl.arange(0, BLOCK_H)
    w2_ptrs = w2_ptr + expert * w2_stride_e + h[:, None] * w2_stride_h + n[None, :]
    acc_row = acc_ptr + t.to(tl.int64) * H + h
    c = tl.arange(0, 16)   # inter as column 0 of a [BLOCK_N, 16] tile (exact in the activation dtype)
    b = tl.where(c[None, :] == 0, inter[:, None], 0.0)
    b = b if DOT_F32 else b.to(dt)
    for h0 in range(0, H, BLOCK_H):
        h_ok = (h < H - h0) | EVEN_H
        w2 = tl.load(w2_ptrs, mask=h_ok[:, None] & n_ok[None, :], other=0.0)
        w2 = w2.to(tl.float32) if DOT_F32 else w2
        part = tl.sum(tl.dot(w2, b, input_precision=DOT_PRECISION), axis=1)
        tl.atomic_add(acc_row, part * route_w, mask=h_ok, sem="relaxed")
        w2_ptrs += BLOCK_H * w2_stride_h
        acc_row += BLOCK_H
    # 4. the last program out: rounding (and the residual add + RMSNorm epilogue), workspace zeroed
    _finish_rows(acc_ptr, count_ptr, out_ptr, res_ptr, sum_ptr, norm_ptr, T, H, eps, tl.num_programs(0), NORM,
                 HAS_RESIDUAL, BLOCK_W, BLOCK_T)


def fused_moe_decode(hidden: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     top_k: int, renormalize: bool, config: DecodeConfig, workspace: SplitKWorkspace | None = None,
                     residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                     eps: float = 1e-6):
    """The one-launch path of `moe.fused_moe` (same arguments, checked there): [T, H] in hidden's dtype, or with
    `norm_weight` the pair (RMSNorm(out [+ residual]) * norm_weight, out [+ residual]) as `rms_norm` returns it.
    Raises ValueError when `workspace` does not fit or the norm arguments do not match."""
    T, H = hidden.shape
    E, inter = w13.shape[0], w13.shape[1] // 2
    config = fit_decode_config(config, hidden.dtype)
    workspace = workspace_for("fused_moe", workspace, T, H, hidden.device)
    residual, norm_weight = norm_args("fused_moe", T, H, hidden.dtype, residual, norm_weight)
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    out, summed = finish_outputs(T, H, hidden, residual)
    grid = (T * top_k * triton.cdiv(inter, config.BLOCK_N),)
    pdl = pdl_for(hidden.device, T)
    _moe_decode_kernel[grid](hidden, router_logits, w13, w2, out, workspace.accumulator, workspace.counter,
                             out if residual is None else residual, summed, out if norm_weight is None else norm_weight,
                             float(eps), T, E, H, inter, hidden.stride(0), router_logits.stride(0), w13.stride(0),
                             w13.stride(1), w2.stride(0), w2.stride(1), TOP_K=top_k,
                             TOP_K_POW2=triton.next_power_of_2(top_k), RENORM=bool(renormalize),
                             BLOCK_E=triton.next_power_of_2(E), BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
                             BLOCK_H=config.BLOCK_H, EVEN_K=H % config.BLOCK_K == 0,
                             EVEN_H=H % config.BLOCK_H == 0, DOT_F32=DOT_IN_FP32,
                             DOT_PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
                             NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None, BLOCK_W=finish_block(H),
                             BLOCK_T=finish_rows(T, H), PDL=pdl, PREFETCH=pdl and prefetch("fused_moe"), launch_pdl=pdl,
                             num_warps=config.num_warps, num_stages=config.num_stages)
    return out if residual is None else (out, summed)


SHARED_MEMORY_LIMIT = 224 * 1024   # of the H100/H200's 227 KB per block


def fit_decode_config(config: DecodeConfig, dtype: torch.dtype) -> DecodeConfig:
    """The config with its pipelining depth lowered (then BLOCK_K and BLOCK_H halved) until its shared memory
    fits: Triton keeps num_stages - 1 tiles of each pipelined loop (the gate/up loop: the padded row tile and two
    weight tiles; the down loop: one weight tile), the larger loop's ring counts (as read from its out-of-resources
    reports on the H200). The table is sized for bf16; fp32 tiles take twice the bytes."""
    size = torch.tensor([], dtype=dtype).element_size()

    def ring(c: DecodeConfig) -> int:
        return max((16 + 2 * c.BLOCK_N) * c.BLOCK_K, c.BLOCK_H * c.BLOCK_N) * size
    while ring(config) > SHARED_MEMORY_LIMIT and config.BLOCK_K > 16:
        config = dataclasses.replace(config, BLOCK_K=config.BLOCK_K // 2, BLOCK_H=max(16, config.BLOCK_H // 2))
    return dataclasses.replace(config, num_stages=max(1, min(config.num_stages, 1 + SHARED_MEMORY_LIMIT // ring(config))))
