"""Decode-sized linear (<= 16 rows) with the decoder's residual add and next RMSNorm fused into its last program.

In a decode step o_proj is followed by `residual + o_proj(attn)` and the post-attention RMSNorm, and a dense
MLP's down_proj by the next layer's input norm: two launches each (torch's GEMM, then `rms_norm`). Here one
launch does both: programs own (BLOCK_N output columns, one of SPLIT_K slices of the reduction dim); each
multiplies the rows (padded to one 16-row MMA tile) by its weight slice with Triton's pipelined async copies and
adds its partial [T, BLOCK_N] into an fp32 `splitk.SplitKWorkspace`; the last program rounds the sums to the
output dtype (as torch rounds the linear's output), adds the residual and applies the norm
(`splitk._finish_rows`, with `rms_norm`'s roundings) and leaves the workspace zeroed.

Without the norm and with one K slice (`SPLIT_K` 1: the column tiles alone fill the GPU, e.g. q/k/v) each program
stores its rounded [T, BLOCK_N] directly: no atomics, no finish, no workspace. Launched with programmatic
dependent launch where available (`backend.grid_dependency`); with `backend.set_prefetch(True)` each program
first pulls its weight slice into L2 (the weights do not depend on the kernel before it).

Numerics: the linear's sums differ from torch's GEMM only in summation order (and vary in the last bit from
run to run: fp32 atomics; the direct-store path is deterministic); the epilogue is `rms_norm_reference` on the
rounded output.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .backend import (DOT_IN_FP32, dot_step, grid_dependency, kernel, pdl_for, prefetch, prefetch_l2, round_to, select,
                      tl, triton)
from .norm import rms_norm_reference
from .splitk import SplitKWorkspace, _finish_rows, finish_block, finish_outputs, finish_rows, norm_args, workspace_for

MAX_ROWS = 16   # one MMA row tile
MAX_OUT = 16384  # with a finish (K split or norm), the last program holds one output row in registers


@dataclasses.dataclass(frozen=True)
class LinearConfig:
    """Programs = cdiv(N, BLOCK_N) x SPLIT_K; each walks its K slice in BLOCK_K steps, num_stages deep."""
    BLOCK_N: int
    BLOCK_K: int
    SPLIT_K: int
    num_warps: int = 4
    num_stages: int = 4


# (out features N, in features K) -> config at one row, tuned on the H200 for the Qwen3-Omni decoders' linears
# (`scripts/bench_kernels --tune-decode`, run 14 with programmatic dependent launch,
# bench/results/tune_decode_h200_run14.json; the thinker's router and lm_head from run 16,
# bench/results/tune_decode_h200_run16.json); None: torch's linear (+ rms_norm) was faster for that shape. SPLIT_K 1
# is the direct-store path. The thinker's q/k/v tile was 1.5% slower than cuBLAS alone (8.16 vs 8.04 us) and is
# kept: in the decode step it is a PDL launch between PDL launches, where cuBLAS's kernel leaves a launch gap on
# each side. The lm_head (0.62 GB) streams at 4.45 TB/s (139.9 us vs cuBLAS 150.2 us, run 16). Run 16's other
# winners (talker / code predictor: 5 stages, 8 warps) were faster alone but made the talker frame 3.5% slower in
# the decode chain, and are not taken. Shapes not in the table get `linear_config`'s rule.
LINEAR_CONFIGS: dict[tuple[int, int], LinearConfig | None] = {
    (2048, 4096): LinearConfig(BLOCK_N=64, BLOCK_K=128, SPLIT_K=8, num_warps=4, num_stages=3),    # thinker o_proj
    (5120, 2048): LinearConfig(BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3),    # thinker q/k/v
    (128, 2048): LinearConfig(BLOCK_N=16, BLOCK_K=128, SPLIT_K=16, num_warps=4, num_stages=3),    # thinker router
    (1024, 2048): LinearConfig(BLOCK_N=64, BLOCK_K=128, SPLIT_K=8, num_warps=4, num_stages=3),    # talker o_proj
    (2560, 1024): LinearConfig(BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3),    # talker q/k/v
    (128, 1024): LinearConfig(BLOCK_N=16, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3),     # talker router
    (4096, 1024): LinearConfig(BLOCK_N=32, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4),    # predictor q/k/v
    (6144, 1024): LinearConfig(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, num_warps=4, num_stages=4),    # predictor gate/up
    (1024, 3072): LinearConfig(BLOCK_N=64, BLOCK_K=128, SPLIT_K=8, num_warps=4, num_stages=3),    # predictor down
    (152064, 2048): LinearConfig(BLOCK_N=64, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=3),  # thinker lm_head
}


def linear_config(n: int, k: int) -> LinearConfig:
    """The table's config for weights [n, k], else 32-column blocks and a K split giving >= 256 programs
    (BLOCK_K 128; each split a multiple of it)."""
    if LINEAR_CONFIGS.get((n, k)) is not None:
        return LINEAR_CONFIGS[(n, k)]
    blocks = triton.cdiv(n, 32)
    split = max(1, min(triton.cdiv(256, blocks), triton.cdiv(k, 128)))
    return LinearConfig(32, 128, split, 4, 3)


def decode_linear_faster(n: int, k: int, with_norm: bool) -> bool:
    """Whether `decode_linear` should replace torch's linear for weights [n, k] at decode sizes: with the norm
    epilogue (it saves the norm's launch) unless the table marks the shape slower; a plain linear only where the
    table has a config (it measured faster)."""
    if (n, k) in LINEAR_CONFIGS:
        return LINEAR_CONFIGS[(n, k)] is not None
    return with_norm


def decode_linear_reference(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None,
                            norm_weight: torch.Tensor | None = None, eps: float = 1e-6):
    """PyTorch reference of `decode_linear`: `F.linear`, then `rms_norm_reference` when norm_weight is given."""
    out = F.linear(x, weight)
    return out if norm_weight is None else rms_norm_reference(out, norm_weight, eps, residual)


@kernel
def _decode_linear_kernel(x_ptr, w_ptr, out_ptr, acc_ptr, count_ptr, res_ptr, sum_ptr, norm_ptr, eps, T, N, K,
                          x_stride, w_stride, k_split, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          EVEN_K: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                          NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_W: tl.constexpr,
                          BLOCK_T: tl.constexpr, DIRECT: tl.constexpr, PDL: tl.constexpr,
                          PREFETCH_LINES: tl.constexpr, LINE: tl.constexpr):
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(N, BLOCK_N)
    n = (pid % n_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    k_start = (pid // n_blocks) * k_split
    k_end = tl.minimum(k_start + k_split, K)
    if PREFETCH_LINES > 0:   # this program's weight slice into L2, one pointer per LINE elements (128 bytes)
        lines = tl.minimum(k_start + tl.arange(0, PREFETCH_LINES) * LINE, k_end - 1)
        prefetch_l2(w_ptr + tl.minimum(n, N - 1)[:, None].to(tl.int64) * w_stride + lines[None, :])
    grid_dependency(PDL)
    m = tl.arange(0, 16)
    m_ok = m < T
    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + m[:, None] * x_stride + k_start + k[None, :]
    w_ptrs = w_ptr + n[None, :].to(tl.int64) * w_stride + k_start + k[:, None]
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = (k < k_end - k0) | EVEN_K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = dot_step(a, w_ptrs, k_ok[:, None] & n_ok[None, :], acc, DOT_F32, DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if DIRECT:
        tl.store(out_ptr + m[:, None] * N + n[None, :], round_to(acc, out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
    else:
        tl.atomic_add(acc_ptr + m[:, None] * N + n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :], sem="relaxed")
        _finish_rows(acc_ptr, count_ptr, out_ptr, res_ptr, sum_ptr, norm_ptr, T, N, eps, tl.num_programs(0), NORM,
                     HAS_RESIDUAL, BLOCK_W, BLOCK_T)


def decode_linear(x: torch.Tensor, weight: torch.Tensor, workspace: SplitKWorkspace | None = None,
                  residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
                  config: LinearConfig | None = None):
    """`F.linear(x, weight)` for a few rows, optionally followed by the residual add and RMSNorm.

    x: [T, K] with T <= 16 (bf16/fp16/fp32); weight: [N, K] in x's dtype (a bias-free linear's weight), N <= 16384
    unless the config is direct-store (SPLIT_K 1 and no norm: e.g. an lm_head). workspace: `SplitKWorkspace(max_rows
    >= T, N, device)`, reused call after call on one stream (default: a new one per call; the direct store needs
    none). norm_weight [N] (x's dtype), eps, residual [T, N] (optional): return
    what `rms_norm(out, norm_weight, eps, residual)` returns (`(normed, out + residual)` with a residual).
    config: tile and K split (default `linear_config(N, K)`). Returns [T, N] in x's dtype (or that norm's result).
    Raises ValueError on mismatched shapes/dtypes, more than 16 rows, more than 16384 outputs with a K split or the
    norm, or a workspace that does not fit.
    Source: torch.nn.Linear, the decoder layer's residual add, transformers Qwen3OmniMoeThinkerTextRMSNorm.
    """
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != weight.dtype \
            or not 0 < x.shape[0] <= MAX_ROWS:
        raise ValueError(f"decode_linear: x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.dtype} "
                         f"(1..{MAX_ROWS} rows)")
    (T, K), N = x.shape, weight.shape[0]
    residual, norm_weight = norm_args("decode_linear", T, N, x.dtype, residual, norm_weight)
    config = config or linear_config(N, K)
    k_split = triton.cdiv(triton.cdiv(K, config.SPLIT_K), config.BLOCK_K) * config.BLOCK_K
    splits = triton.cdiv(K, k_split)
    direct = splits == 1 and norm_weight is None
    if not direct and N > MAX_OUT:
        raise ValueError(f"decode_linear: weight {tuple(weight.shape)}: more than {MAX_OUT} outputs need the "
                         f"direct store (SPLIT_K 1, no norm; config {config})")
    backend = select("decode_linear", x, weight)
    if backend == "reference":
        return decode_linear_reference(x, weight, residual, norm_weight, eps)
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    if direct:   # no accumulator (a given workspace is checked, not touched)
        acc = counter = x if workspace is None else workspace.check("decode_linear", T, N, x.device).accumulator
    else:
        workspace = workspace_for("decode_linear", workspace, T, N, x.device)
        acc, counter = workspace.accumulator, workspace.counter
    out, summed = finish_outputs(T, N, x, residual)
    pdl = pdl_for(x.device, T)
    prefetch_lines = triton.next_power_of_2(triton.cdiv(k_split * x.element_size(), 128)) \
        if pdl and prefetch("decode_linear") else 0
    grid = (triton.cdiv(N, config.BLOCK_N) * splits,)
    _decode_linear_kernel[grid](x, weight, out, acc, counter, out if residual is None else residual, summed,
                                out if norm_weight is None else norm_weight, float(eps), T, N, K, x.stride(0),
                                weight.stride(0), k_split, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
                                EVEN_K=K % config.BLOCK_K == 0, DOT_F32=DOT_IN_FP32,
                                DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                                NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
                                BLOCK_W=finish_block(N), BLOCK_T=finish_rows(T, N), DIRECT=direct, PDL=pdl, PREFETCH_LINES=prefetch_lines,
                                LINE=128 // x.element_size(), launch_pdl=pdl,
                                num_warps=config.num_warps, num_stages=config.num_stages)
    return out if residual is None else (out, summed)
