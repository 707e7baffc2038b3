"""One-launch fused MoE for decode (a few tokens): routing, gate_up, SiLU-mul, down and the top-k sum in ONE kernel.

At one token the grouped path of `moe.fused_moe` is four launches (route + align, gate_up GEMM, down GEMM,
top-k sum) around ~24 us of weight streaming (thinker: 8 experts x 9.4 MB); the launch tails and the
single-program routing cost ~8 us of its ~31 us (57% of the copy bandwidth, H200 runs 3-5). Here every
program owns one token-slot (slot = token * top_k + j, the token's j-th expert in ascending id order) and
BLOCK_N columns of the expert's intermediate dim I:
  1. it routes its token itself (softmax, top-k, renormalise over the E logits: `moe_routing._route_rows`);
  2. gate/up GEMV: the BLOCK_N gate rows and up rows of W13[e] against the token's hidden row (fp32 FMA
     over BLOCK_K-wide chunks: one row, no MMA tile padded to 16 rows), SiLU(gate) * up in registers, rounded
     where transformers' unfused code rounds (each linear's output, silu's output, the product);
  3. split-K down: those BLOCK_N intermediate values times the matching BLOCK_N columns of W2[e] give a partial
     [H] row, times the routing weight, added into an fp32 accumulator [T, H] with relaxed atomics (the sum
     over I-chunks and over the token's experts in one place);
  4. the last program to finish converts the accumulator to the output dtype and, when asked, adds the residual
     and applies the next RMSNorm (`splitk._finish_rows`: the decoder's next input norm costs no launch).
So the intermediate [slots, I] and the per-slot rows [slots, H] never reach memory, and the weights are
streamed by T * top_k * I / BLOCK_N programs at once (thinker, T=1, BLOCK_N 16: 384).

Numerics: the down products are summed in fp32 over I-chunks and experts and rounded once, where the reference
rounds each expert's down output, its weighted row and each partial sum to the activation dtype: the results
agree to bf16 rounding (relative error ~1e-3), and the fp32 atomics make the last bits of bf16 outputs vary
between runs (the order of the adds). The grouped path stays bit-stable; it is used past `decode_tokens`.

The accumulator and counter live in a `splitk.SplitKWorkspace` [T, H] that the launch leaves zeroed: one per
call site (the engine keeps one per MoE layer, so graphs of different engines on different streams never share
one); without one, each call allocates a zeroed workspace (one memset).
"""
from __future__ import annotations

import torch

from .backend import DOT_IN_FP32, helper, kernel, rounded, tl, triton
from .moe_configs import DecodeConfig
from .splitk import (SplitKWorkspace, _fence_every_thread, _finish_rows, _wait_for_count, finish_block, finish_outputs,
                     norm_args, workspace_for)

ROUTER_EXPERTS = 4   # experts per router program of the in-kernel router (one [4, H] weight tile in registers)

@helper
def _slot_route(logits_ptr, t, logits_stride, E, j, TOP_K: tl.constexpr, TOP_K_POW2: tl.constexpr,
                RENORM: tl.constexpr, BLOCK_E: tl.constexpr, WEIGHT_DT: tl.constexpr, LOAD_CACHE: tl.constexpr):
    # token t's expert of rank j (0 = highest probability; ties: lower id first) and its routing weight (fp32,
    # rounded to the logits' dtype). One bitonic top-k over int64 keys (probability bits above the inverted
    # expert id: probabilities are >= 0, so their bits order like the values) instead of top_k rounds of
    # arg-max, each two block-wide reductions, on every program's critical path.
    e = tl.arange(0, BLOCK_E)
    e_ok = e < E
    logits = tl.load(logits_ptr + t * logits_stride + e, mask=e_ok, other=float("-inf"),
                     cache_modifier=LOAD_CACHE).to(tl.float32)
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
    return expert, rounded(weight, WEIGHT_DT)


@helper
def _router_slice(x_ptr, router_ptr, scratch_ptr, r, T, E, H, x_stride, ROUTER_EXPERTS: tl.constexpr,
                  BLOCK_HR: tl.constexpr):
    # router programs: logits of experts r*ROUTER_EXPERTS.. for every token, the whole hidden row in one load (one
    # memory round trip), rounded to the activation dtype as the gate linear's output is, into the scratch [T, E]
    e = r * ROUTER_EXPERTS + tl.arange(0, ROUTER_EXPERTS)
    e_ok = e < E
    k = tl.arange(0, BLOCK_HR)
    k_ok = k < H
    w = tl.load(router_ptr + e[:, None] * H + k[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
    w = w.to(tl.float32)
    for t in range(T):
        xv = tl.load(x_ptr + t * x_stride + k, mask=k_ok, other=0.0).to(tl.float32)
        logit = tl.sum(w * xv[None, :], axis=1)
        tl.store(scratch_ptr + t * E + e, rounded(logit, x_ptr.dtype.element_ty), mask=e_ok)


@kernel
def _moe_decode_kernel(x_ptr, logits_ptr, router_ptr, scratch_ptr, w13_ptr, w2_ptr, out_ptr, acc_ptr, count_ptr,
                       res_ptr, sum_ptr, norm_ptr, eps, T, E, H, I, x_stride, logits_stride, w13_stride_e,
                       w13_stride_n, w2_stride_e, w2_stride_h, router_programs, TOP_K: tl.constexpr,
                       TOP_K_POW2: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr, ROUTER: tl.constexpr,
                       ROUTER_EXPERTS: tl.constexpr, BLOCK_HR: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, USE_DOT: tl.constexpr, EVEN_K: tl.constexpr,
                       EVEN_H: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr, NORM: tl.constexpr,
                       HAS_RESIDUAL: tl.constexpr, BLOCK_W: tl.constexpr):
    dt = out_ptr.dtype.element_ty
    n_blocks = tl.cdiv(I, BLOCK_N)
    if ROUTER:   # 0. the router in this launch: the first router_programs tickets compute the logits
        ticket = tl.atomic_add(count_ptr + 1, 1, sem="relaxed")
        if ticket < router_programs:
            _router_slice(x_ptr, router_ptr, scratch_ptr, ticket, T, E, H, x_stride, ROUTER_EXPERTS, BLOCK_HR)
            _fence_every_thread()
            tl.debug_barrier()
            tl.atomic_add(count_ptr + 2, 1, sem="release")
            return
        # the programs holding the first tickets are running and wait for nothing: no deadlock
        _wait_for_count(count_ptr + 2, router_programs)
        work = ticket - router_programs
        slot = work // n_blocks
        t = slot // TOP_K
        expert, route_w = _slot_route(scratch_ptr, t, E, E, slot % TOP_K, TOP_K, TOP_K_POW2, RENORM, BLOCK_E, dt,
                                      ".cg")
    else:
        work = tl.program_id(0)
        slot = work // n_blocks
        t = slot // TOP_K
        # 1. the token's routing (every program of the token recomputes it from the E logits)
        expert, route_w = _slot_route(logits_ptr, t, logits_stride, E, slot % TOP_K, TOP_K, TOP_K_POW2, RENORM,
                                      BLOCK_E, logits_ptr.dtype.element_ty, "")
    # 2. gate/up GEMV for BLOCK_N columns of I, SiLU-mul epilogue
    n = (work % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < I
    k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + t.to(tl.int64) * x_stride
    if USE_DOT:   # the row padded to a 16-row MMA tile: the loads become multi-stage async copies
        m = tl.arange(0, 16)
        a_ptrs = x_row + m[:, None] * 0 + k[None, :]
        g_ptrs = w13_ptr + expert * w13_stride_e + n[None, :] * w13_stride_n + k[:, None]
        acc_g = tl.zeros([16, BLOCK_N], tl.float32)
        acc_u = tl.zeros([16, BLOCK_N], tl.float32)
    else:         # fp32 FMA on [BLOCK_N, BLOCK_K] tiles, one reduction at the end
        a_ptrs = x_row + k
        g_ptrs = w13_ptr + expert * w13_stride_e + n[:, None] * w13_stride_n + k[None, :]
        acc_g = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    u_ptrs = g_ptrs + I * w13_stride_n
    for k0 in range(0, H, BLOCK_K):
        k_ok = (k < H - k0) | EVEN_K
        if USE_DOT:
            a = tl.load(a_ptrs, mask=(m[:, None] == 0) & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if DOT_F32:
                a, g, u = a.to(tl.float32), g.to(tl.float32), u.to(tl.float32)
            acc_g = tl.dot(a, g, acc_g, input_precision=DOT_PRECISION)
            acc_u = tl.dot(a, u, acc_u, input_precision=DOT_PRECISION)
        else:
            a = tl.load(a_ptrs, mask=k_ok, other=0.0).to(tl.float32)
            g = tl.load(g_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc_g += g.to(tl.float32) * a[None, :]
            acc_u += u.to(tl.float32) * a[None, :]
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    if USE_DOT:   # row 0 of the padded tile
        acc_g = tl.where(m[:, None] == 0, acc_g, 0.0)
        acc_u = tl.where(m[:, None] == 0, acc_u, 0.0)
        gate, up = tl.sum(acc_g, axis=0), tl.sum(acc_u, axis=0)
    else:
        gate, up = tl.sum(acc_g, axis=1), tl.sum(acc_u, axis=1)
    gate = rounded(gate, dt)
    inter = tl.where(n_ok, rounded(rounded(gate * tl.sigmoid(gate), dt) * rounded(up, dt), dt), 0.0)
    # 3. split-K down: W2[e][:, n] . inter for every hidden row, times the routing weight, into the token's
    #    fp32 accumulator row
    h = tl.arange(0, BLOCK_H)
    w2_ptrs = w2_ptr + expert * w2_stride_e + h[:, None] * w2_stride_h + n[None, :]
    acc_row = acc_ptr + t.to(tl.int64) * H + h
    if USE_DOT:   # inter as column 0 of a [BLOCK_N, 16] tile (exact in the activation dtype)
        c = tl.arange(0, 16)
        b = tl.where(c[None, :] == 0, inter[:, None], 0.0)
        b = b if DOT_F32 else b.to(dt)
    for h0 in range(0, H, BLOCK_H):
        h_ok = (h < H - h0) | EVEN_H
        w2 = tl.load(w2_ptrs, mask=h_ok[:, None] & n_ok[None, :], other=0.0)
        if USE_DOT:
            w2 = w2.to(tl.float32) if DOT_F32 else w2
            part = tl.sum(tl.dot(w2, b, input_precision=DOT_PRECISION), axis=1)
        else:
            part = tl.sum(w2.to(tl.float32) * inter[None, :], axis=1)
        tl.atomic_add(acc_row, part * route_w, mask=h_ok, sem="relaxed")
        w2_ptrs += BLOCK_H * w2_stride_h
        acc_row += BLOCK_H
    # 4. the last program out: rounding (and the residual add + RMSNorm epilogue), workspace zeroed
    _finish_rows(acc_ptr, count_ptr, out_ptr, res_ptr, sum_ptr, norm_ptr, T, H, eps,
                 tl.num_programs(0) - router_programs, NORM, HAS_RESIDUAL, BLOCK_W)


def fused_moe_decode(hidden: torch.Tensor, router_logits: torch.Tensor | None, w13: torch.Tensor, w2: torch.Tensor,
                     top_k: int, renormalize: bool, config: DecodeConfig, workspace: SplitKWorkspace | None = None,
                     residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                     eps: float = 1e-6, router_weight: torch.Tensor | None = None):
    """The one-launch path of `moe.fused_moe` (same arguments, checked there): [T, H] in hidden's dtype, or with
    `norm_weight` the pair (RMSNorm(out [+ residual]) * norm_weight, out [+ residual]) as `rms_norm` returns it.
    Without router_logits, the router_weight [E, H] (contiguous) is applied in the same launch: cdiv(E, 4) extra
    programs compute the logits into the workspace's scratch (it needs scratch >= E) while the others wait.
    Raises ValueError when `workspace` does not fit or the norm arguments do not match."""
    T, H = hidden.shape
    E, inter = w13.shape[0], w13.shape[1] // 2
    in_kernel_router = router_logits is None
    workspace = workspace_for("fused_moe", workspace, T, H, hidden.device, E if in_kernel_router else 0)
    residual, norm_weight = norm_args("fused_moe", T, H, hidden.dtype, residual, norm_weight)
    if in_kernel_router:
        router_weight = router_weight.contiguous()
        router_logits = router_weight   # unused by the kernel
        router_programs = triton.cdiv(E, ROUTER_EXPERTS)
    else:
        router_logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
        router_weight, router_programs = router_logits, 0   # unused by the kernel
    out, summed = finish_outputs(T, H, hidden, residual)
    grid = (router_programs + T * top_k * triton.cdiv(inter, config.BLOCK_N),)
    _moe_decode_kernel[grid](hidden, router_logits, router_weight, workspace.scratch, w13, w2, out,
                             workspace.accumulator, workspace.counters, out if residual is None else residual, summed,
                             out if norm_weight is None else norm_weight, float(eps), T, E, H, inter,
                             hidden.stride(0), router_logits.stride(0), w13.stride(0), w13.stride(1), w2.stride(0),
                             w2.stride(1), router_programs, TOP_K=top_k, TOP_K_POW2=triton.next_power_of_2(top_k),
                             RENORM=bool(renormalize), BLOCK_E=triton.next_power_of_2(E), ROUTER=in_kernel_router,
                             ROUTER_EXPERTS=ROUTER_EXPERTS, BLOCK_HR=triton.next_power_of_2(H),
                             BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, BLOCK_H=config.BLOCK_H,
                             USE_DOT=config.use_dot, EVEN_K=H % config.BLOCK_K == 0, EVEN_H=H % config.BLOCK_H == 0,
                             DOT_F32=DOT_IN_FP32, DOT_PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
                             NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None, BLOCK_W=finish_block(H),
                             num_warps=config.num_warps, num_stages=config.num_stages)
    return out if residual is None else (out, summed)
