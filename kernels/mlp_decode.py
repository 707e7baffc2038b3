"""A decode-sized gated MLP (<= 16 rows) in one launch: gate/up, SiLU-and-mul, down_proj, residual add and RMSNorm.

The code predictor's dense MLP at 8-16 rows was four launches (cuBLAS gate/up, `silu_and_mul`, cuBLAS down_proj with
its split-K reduce, `rms_norm` with the residual add; H200 runs 29-32), each too short to reach HBM bandwidth. Here
one launch of P programs (at most the GPU's multiprocessors, all resident at once) runs three phases separated by
grid-wide barriers (a counter each, release/acquire):
  1. each program takes BLOCK_I columns of the intermediate at a time: the rows (padded to one 16-row MMA tile)
     times its gate and up rows of the concatenated [gate | up] weight, SiLU-and-mul in registers (rounded where the
     unfused code rounds: the linears' outputs, silu's result, the product), stored to a small scratch [T, I];
  2. each program takes BLOCK_H output columns at a time: scratch [T, I] (from L2) times its down_proj rows, rounded
     (the linear's output), plus the residual (rounded: the decoder's `residual + hidden`), stored, and each row's
     sum of squares added into a [T] fp32 accumulator (no split-K atomics over the output, no serial finish);
  3. each program scales its columns by the rows' 1/rms and the norm weight (`rms_norm`'s roundings).
The last program out zeroes the counters and sums for the next launch (`MlpWorkspace`).

Triton's interpreter runs programs one after another, so a barrier would wait forever there: interpreted, the same
kernel runs as one launch per phase (PHASE 1, 2, 3) instead of PHASE 0 (all three). A grid larger than the programs
that can be resident at once would deadlock: `decode_mlp` launches at most the multiprocessor count (one program per
SM fits: the tiles need ~60 KB of shared memory); the engine does not use it inside an SM-partitioned green context.

Numerics: the linears sum in another order than torch's GEMMs; the row sums of squares are fp32 atomics, so their
order (the last bit of 1/rms) varies from run to run.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .activation import silu_and_mul_reference
from .backend import (DOT_IN_FP32, INTERPRETED, dot_step, grid_dependency, helper, kernel, pdl_for, round_to,
                      rounded, select, tl, triton)
from .norm import rms_norm_reference
from .splitk import _fence_every_thread, norm_args

MAX_ROWS = 16     # one MMA row tile


@dataclasses.dataclass(frozen=True)
class MlpConfig:
    """PROGRAMS programs (capped at the multiprocessor count); phase 1 takes BLOCK_I intermediate columns at a time and
    walks the hidden dim in BLOCK_K steps, phase 2 BLOCK_H output columns at a time, walking the intermediate in
    BLOCK_J steps."""
    PROGRAMS: int
    BLOCK_I: int
    BLOCK_K: int
    BLOCK_H: int
    BLOCK_J: int
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_CONFIG = MlpConfig(PROGRAMS=96, BLOCK_I=32, BLOCK_K=256, BLOCK_H=16, BLOCK_J=512, num_warps=4, num_stages=3)
# (most rows, config), by rows: tuned on the H200 for the code predictor's MLP (H 1024, I 3072) with
# `scripts/bench_kernels --tune-mlp --apply` (run 33: only 16 rows beat torch's linears + silu_and_mul + rms_norm,
# 16.8-17.2 vs 17.6-17.7 us; at 1-8 rows DEFAULT_CONFIG was the best tile and lost or tied); rows past the last entry
# get DEFAULT_CONFIG.
MLP_CONFIGS: list[tuple[int, MlpConfig]] = [
    (16, MlpConfig(PROGRAMS=96, BLOCK_I=32, BLOCK_K=256, BLOCK_H=16, BLOCK_J=1024, num_warps=4, num_stages=3)),
]


def mlp_config(rows: int) -> MlpConfig:
    """The table's config for `rows` rows (the first entry for at least that many), else DEFAULT_CONFIG."""
    return next((config for most, config in MLP_CONFIGS if rows <= most), DEFAULT_CONFIG)


class MlpWorkspace:
    """What one `decode_mlp` launch shares between its programs: the SiLU-and-mul scratch [max_rows, inter] (dtype),
    the rows' fp32 sums of squares [max_rows] and three int32 counters (two barriers, the last program out), on
    `device`. Each launch leaves the sums and counters zeroed, so one workspace serves every later launch on the same
    stream; launches that may run at once need different workspaces. Keep it alive as long as CUDA graphs that
    captured it."""

    def __init__(self, max_rows: int, inter: int, dtype: torch.dtype, device: torch.device | str):
        self.max_rows, self.inter, self.dtype = max_rows, inter, dtype
        self.scratch = torch.empty(max_rows, inter, dtype=dtype, device=device)
        self.sums = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.counters = torch.zeros(3, dtype=torch.int32, device=device)

    def check(self, rows: int, inter: int, dtype: torch.dtype, device: torch.device) -> "MlpWorkspace":
        """self, or ValueError when a launch of `rows` rows, `inter` intermediate columns and `dtype` cannot use it."""
        if rows > self.max_rows or inter != self.inter or dtype != self.dtype or self.sums.device != device:
            raise ValueError(f"decode_mlp: workspace for {self.max_rows} x {self.inter} {self.dtype} on "
                             f"{self.sums.device} cannot take {rows} x {inter} {dtype} on {device}")
        return self

    def is_clean(self) -> bool:
        """True when the sums and counters are zero (as every launch leaves them)."""
        return not self.sums.any() and not self.counters.any()


def decode_mlp_reference(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                         residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None,
                         eps: float = 1e-6):
    """PyTorch reference of `decode_mlp`: `F.linear(silu_and_mul(F.linear(x, gate_up)), down)`, then
    `rms_norm_reference` when norm_weight is given."""
    out = F.linear(silu_and_mul_reference(F.linear(x, gate_up)), down)
    return out if norm_weight is None else rms_norm_reference(out, norm_weight, eps, residual)


@helper
def _grid_barrier(count_ptr, programs):
    # every thread's writes so far are performed at GPU scope before this program's arrival (release), and its later
    # reads come after every program's arrival (acquire); the interpreter never gets here (one launch per phase)
    # (polled with plain volatile loads: atomics on the one counter line would queue behind each other at L2)
    _fence_every_thread()
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")
    while tl.load(count_ptr, volatile=True) < programs:
        pass
    _fence_every_thread()


@kernel
def _decode_mlp_kernel(x_ptr, w13_ptr, w2_ptr, act_ptr, res_ptr, norm_ptr, sum_ptr, out_ptr, ss_ptr, sync_ptr, eps,
                       T, H, I, x_stride, w13_stride, w2_stride, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_J: tl.constexpr, PHASE: tl.constexpr, NORM: tl.constexpr,
                       HAS_RESIDUAL: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       PDL: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    grid_dependency(PDL)
    m = tl.arange(0, 16)
    m_ok = m < T
    dt = out_ptr.dtype.element_ty
    if PHASE == 0 or PHASE == 1:   # act = silu(x @ gate^T) * (x @ up^T), BLOCK_I columns at a time
        k = tl.arange(0, BLOCK_K)
        for c in range(pid, tl.cdiv(I, BLOCK_I), programs):
            i = c * BLOCK_I + tl.arange(0, BLOCK_I)
            i_ok = i < I
            a_ptrs = x_ptr + m[:, None] * x_stride + k[None, :]
            g_ptrs = w13_ptr + i[None, :].to(tl.int64) * w13_stride + k[:, None]
            u_ptrs = g_ptrs + I.to(tl.int64) * w13_stride
            gate = tl.zeros([16, BLOCK_I], tl.float32)
            up = tl.zeros([16, BLOCK_I], tl.float32)
            for k0 in range(0, H, BLOCK_K):
                k_ok = k < H - k0
                a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                gate = dot_step(a, g_ptrs, k_ok[:, None] & i_ok[None, :], gate, DOT_F32, DOT_PRECISION)
                up = dot_step(a, u_ptrs, k_ok[:, None] & i_ok[None, :], up, DOT_F32, DOT_PRECISION)
                a_ptrs += BLOCK_K
                g_ptrs += BLOCK_K
                u_ptrs += BLOCK_K
            gate = rounded(gate, dt)
            act = round_to(rounded(gate * tl.sigmoid(gate), dt) * rounded(up, dt), dt)
            tl.store(act_ptr + m[:, None] * I + i[None, :], act, mask=m_ok[:, None] & i_ok[None, :])
    if PHASE == 0:
        _grid_barrier(sync_ptr, programs)
    # phase 2 writes y = rounded(act @ down^T) (+ residual, rounded) where phase 3 reads it: `sum_ptr` (the residual
    # sum, returned) with a residual, else `out_ptr` (overwritten by the normed row)
    y_ptr = sum_ptr if HAS_RESIDUAL else out_ptr
    if PHASE == 0 or PHASE == 2:
        j = tl.arange(0, BLOCK_J)
        for c in range(pid, tl.cdiv(H, BLOCK_H), programs):
            h = c * BLOCK_H + tl.arange(0, BLOCK_H)
            h_ok = h < H
            a_ptrs = act_ptr + m[:, None] * I + j[None, :]
            d_ptrs = w2_ptr + h[None, :].to(tl.int64) * w2_stride + j[:, None]   # down_proj [H, I] as [BLOCK_J, BLOCK_H]
            acc = tl.zeros([16, BLOCK_H], tl.float32)
            for j0 in range(0, I, BLOCK_J):
                j_ok = j < I - j0
                a = tl.load(a_ptrs, mask=m_ok[:, None] & j_ok[None, :], other=0.0, cache_modifier=".cg")
                acc = dot_step(a, d_ptrs, j_ok[:, None] & h_ok[None, :], acc, DOT_F32, DOT_PRECISION)
                a_ptrs += BLOCK_J
                d_ptrs += BLOCK_J
            tile = m_ok[:, None] & h_ok[None, :]
            y = rounded(acc, dt)
            if HAS_RESIDUAL:
                y = rounded(y + tl.load(res_ptr + m[:, None] * H + h[None, :], mask=tile, other=0.0).to(tl.float32), dt)
            tl.store(y_ptr + m[:, None] * H + h[None, :], round_to(y, dt), mask=tile)
            if NORM:
                tl.atomic_add(ss_ptr + m, tl.sum(y * y, axis=1), mask=m_ok, sem="relaxed")
    if NORM:
        if PHASE == 0:
            _grid_barrier(sync_ptr + 1, programs)
        if PHASE == 0 or PHASE == 3:   # out = RMSNorm(y) * weight, with rms_norm's roundings
            rstd = 1.0 / tl.sqrt_rn(tl.load(ss_ptr + m, mask=m_ok, other=0.0, volatile=True) / H + eps)
            for c in range(pid, tl.cdiv(H, BLOCK_H), programs):
                h = c * BLOCK_H + tl.arange(0, BLOCK_H)
                tile = m_ok[:, None] & (h < H)[None, :]
                y = tl.load(y_ptr + m[:, None] * H + h[None, :], mask=tile, other=0.0, cache_modifier=".cg")
                weight = tl.load(norm_ptr + h, mask=h < H, other=0.0).to(tl.float32)
                tl.store(out_ptr + m[:, None] * H + h[None, :],
                         round_to(rounded(y.to(tl.float32) * rstd[:, None], dt) * weight[None, :], dt), mask=tile)
    if PHASE == 0 or PHASE == 3 or (PHASE == 2 and not NORM):   # the last program out zeroes sums and counters
        _fence_every_thread()
        tl.debug_barrier()
        if tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel") == programs - 1:
            tl.store(ss_ptr + m, tl.zeros([16], tl.float32), mask=m_ok)
            tl.store(sync_ptr + tl.arange(0, 4), tl.zeros([4], tl.int32), mask=tl.arange(0, 4) < 3)


_sm_count: dict[int, int] = {}


def _programs(device: torch.device, config: MlpConfig) -> int:
    """config.PROGRAMS, at most the multiprocessor count of `device` (every program resident: the barriers)."""
    if device.type != "cuda":
        return config.PROGRAMS
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_count:
        _sm_count[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return min(config.PROGRAMS, _sm_count[index])


def decode_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, workspace: MlpWorkspace | None = None,
               residual: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, eps: float = 1e-6,
               config: MlpConfig | None = None):
    """`down(silu(gate(x)) * up(x))` for a few rows in one launch, optionally followed by the residual add and RMSNorm.

    x: [T, H] with T <= 16 (bf16/fp16/fp32); gate_up: [2I, H] in x's dtype (gate_proj's weight then up_proj's, as
    `fused.fuse_linears` concatenates them); down: [H, I] (down_proj's weight). workspace: `MlpWorkspace(max_rows >=
    T, I, x.dtype, device)`, reused call after call on one stream (default: a new one per call). norm_weight [H] (x's
    dtype), eps, residual [T, H] (optional): return what `rms_norm(out, norm_weight, eps, residual)` returns
    (`(normed, out + residual)` with a residual). config: tiles and programs (default `mlp_config(T)`).
    Returns [T, H] in x's dtype (or that norm's result).
    Raises ValueError on mismatched shapes/dtypes, more than 16 rows, or a workspace that does not fit.
    Source: transformers Qwen3OmniMoeTalkerCodePredictor's MLP (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`),
    the decoder layer's residual add, its RMSNorm.
    """
    if x.dim() != 2 or gate_up.dim() != 2 or down.dim() != 2 or gate_up.shape[1] != x.shape[1] \
            or gate_up.shape[0] % 2 or down.shape != (x.shape[1], gate_up.shape[0] // 2) \
            or not x.dtype == gate_up.dtype == down.dtype or not 0 < x.shape[0] <= MAX_ROWS:
        raise ValueError(f"decode_mlp: x {tuple(x.shape)} {x.dtype}, gate_up {tuple(gate_up.shape)} {gate_up.dtype}, "
                         f"down {tuple(down.shape)} {down.dtype} (1..{MAX_ROWS} rows, gate_up [2I, H], down [H, I])")
    (T, H), I = x.shape, down.shape[1]
    residual, norm_weight = norm_args("decode_mlp", T, H, x.dtype, residual, norm_weight)
    workspace = MlpWorkspace(T, I, x.dtype, x.device) if workspace is None else workspace.check(T, I, x.dtype, x.device)
    config = config or mlp_config(T)
    backend = select("decode_mlp", x, gate_up, down)
    if backend == "reference":
        return decode_mlp_reference(x, gate_up, down, residual, norm_weight, eps)
    x, gate_up, down = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, gate_up, down))
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else out
    pdl = pdl_for(x.device, T)
    norm = norm_weight is not None
    grid = (_programs(x.device, config),)
    for phase in ((1, 2, 3) if norm else (1, 2)) if INTERPRETED else (0,):
        _decode_mlp_kernel[grid](
            x, gate_up, down, workspace.scratch, out if residual is None else residual,
            out if norm_weight is None else norm_weight, summed, out, workspace.sums, workspace.counters, float(eps),
            T, H, I, x.stride(0), gate_up.stride(0), down.stride(0), BLOCK_I=config.BLOCK_I, BLOCK_K=config.BLOCK_K,
            BLOCK_H=config.BLOCK_H, BLOCK_J=config.BLOCK_J, PHASE=phase, NORM=norm, HAS_RESIDUAL=residual is not None,
            DOT_F32=DOT_IN_FP32, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl,
            launch_pdl=pdl, num_warps=config.num_warps, num_stages=config.num_stages)
    return out if residual is None else (out, summed)
