"""Split-K accumulation for decode-sized kernels: an fp32 workspace that programs add into, finished by the last one.

A decode step multiplies one or a few rows by large weights: the work is spread over many programs along the
reduction dim too, each adding its partial rows into an fp32 accumulator with relaxed atomics. The last program
to finish (a counter with acquire/release ordering) then
  - rounds the sums to the output dtype (the linear's output, as torch rounds it), and, when asked,
  - adds the residual and applies RMSNorm, rounding as `norm.rms_norm` does (the decoder layer's
    `residual + hidden` and the next norm, so they cost no launch of their own),
and leaves the accumulator and the counter zeroed for the next launch. Used by `moe_decode` (the one-launch
fused MoE) and `linear_decode` (o_proj / down_proj with the norm that follows them).

The fp32 atomics make the sum order vary between runs: bf16 outputs may differ in the last bit from run to run.
"""
from __future__ import annotations

import torch

from .backend import HAVE_TRITON, INTERPRETED, helper, round_to, rounded, tl, triton

_COMPILED = tl.constexpr(not INTERPRETED) if HAVE_TRITON else False


class SplitKWorkspace:
    """Zeroed fp32 accumulator [max_rows, width] and an int32 program counter on `device`.

    Each launch that uses it leaves both zeroed again (its last program resets them), so one workspace serves
    every later launch on the same stream; launches that may run at once (different streams) need different
    workspaces. Keep it alive as long as CUDA graphs that captured it.
    """

    def __init__(self, max_rows: int, width: int, device: torch.device | str):
        self.max_rows, self.width = max_rows, width
        self.accumulator = torch.zeros(max_rows * width, dtype=torch.float32, device=device)
        self.counter = torch.zeros(1, dtype=torch.int32, device=device)

    def fits(self, rows: int, width: int, device: torch.device) -> bool:
        """True when a launch for `rows` rows of `width` outputs on `device` can use this workspace."""
        return rows <= self.max_rows and width == self.width and self.accumulator.device == device

    def check(self, op: str, rows: int, width: int, device: torch.device) -> "SplitKWorkspace":
        """self, or ValueError naming `op` when it does not fit."""
        if not self.fits(rows, width, device):
            raise ValueError(f"{op}: workspace for {self.max_rows} x {self.width} on {self.accumulator.device} "
                             f"cannot take {rows} x {width} on {device}")
        return self

    def is_clean(self) -> bool:
        """True when the accumulator and the counter are zero (as every launch leaves them)."""
        return not self.accumulator.any() and not self.counter.any()


def workspace_for(op: str, workspace: SplitKWorkspace | None, rows: int, width: int,
                  device: torch.device) -> SplitKWorkspace:
    """The caller's workspace (checked), or a new zeroed one for this call (one memset)."""
    return SplitKWorkspace(rows, width, device) if workspace is None else workspace.check(op, rows, width, device)


@helper
def _fence_every_thread():
    # fence.acq_rel.gpu in every thread: its own atomics so far are performed (at L2) before its later memory
    # operations. A barrier plus one thread's release is not enough for other warps' fire-and-forget reductions
    # (seen on the H200: the last program read sums before some adds had landed, then zeroed them too early).
    # The interpreter runs programs one after another: nothing to order there.
    if _COMPILED:
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [tl.zeros([32], tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@helper
def _finish_rows(acc_ptr, count_ptr, out_ptr, res_ptr, sum_ptr, norm_ptr, T, W, eps, programs,
                 NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr):
    # Called by each of the `programs` adding programs after its atomic adds. The last one out: out[t] = rounded
    # acc[t] (NORM False), or sum[t] = rounded(acc[t]) + res[t] (rounded; HAS_RESIDUAL) and out[t] =
    # RMSNorm(sum[t]) * norm weight with `rms_norm`'s roundings; then the accumulator and the counter are zeroed.
    # Rows are contiguous [T, W]; BLOCK_W >= W; BLOCK_T rows at a time (`finish_rows`: one tile's loads in flight
    # together instead of one row's L2 round trip after another).
    _fence_every_thread()
    tl.debug_barrier()   # every thread's adds are performed before the counter's release
    if tl.atomic_add(count_ptr, 1, sem="acq_rel") == programs - 1:
        _fence_every_thread()   # and the sums are read after the acquire, in every thread
        cols = tl.arange(0, BLOCK_W)
        ok = cols < W
        dt = out_ptr.dtype.element_ty
        if NORM:
            weight = tl.load(norm_ptr + cols, mask=ok, other=0.0).to(tl.float32)[None, :]
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            tile = (t < T)[:, None] & ok[None, :]
            rows = t[:, None] * W + cols[None, :]
            # volatile: read at L2 where the other programs' atomics landed, and never moved past the zeroing
            # below (a plain load is side-effect free for the compiler; multi-row outputs read zeros on the H200)
            y = tl.load(acc_ptr + rows, mask=tile, other=0.0, volatile=True)
            if NORM:
                y = rounded(y, dt)
                if HAS_RESIDUAL:
                    y = rounded(y + tl.load(res_ptr + rows, mask=tile, other=0.0).to(tl.float32), dt)
                    tl.store(sum_ptr + rows, y.to(dt), mask=tile)
                rstd = 1.0 / tl.sqrt_rn(tl.sum(y * y, axis=1) / W + eps)
                y = rounded(y * rstd[:, None], dt) * weight
            tl.store(out_ptr + rows, round_to(y, dt), mask=tile)
        tl.debug_barrier()   # every row is read (and written out) before any is zeroed
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            tl.store(acc_ptr + t[:, None] * W + cols[None, :], tl.zeros([BLOCK_T, BLOCK_W], tl.float32),
                     mask=(t < T)[:, None] & ok[None, :])
        tl.store(count_ptr, 0)


def finish_outputs(rows: int, width: int, like: torch.Tensor, residual: torch.Tensor | None):
    """(out, summed) buffers of a launch that finishes with `_finish_rows`: out [rows, width] in like's dtype;
    summed the residual sum when a residual is given (else out, unused)."""
    out = torch.empty((rows, width), dtype=like.dtype, device=like.device)
    summed = torch.empty_like(out) if residual is not None else out
    return out, summed


def norm_args(op: str, rows: int, width: int, dtype: torch.dtype, residual: torch.Tensor | None,
              norm_weight: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(residual, norm_weight) made contiguous after checking them; ValueError naming `op` otherwise."""
    if residual is not None and norm_weight is None:
        raise ValueError(f"{op}: a residual needs norm_weight (the residual add is part of the norm epilogue)")
    if residual is not None and (residual.shape != (rows, width) or residual.dtype != dtype):
        raise ValueError(f"{op}: residual {tuple(residual.shape)} {residual.dtype}, expected ({rows}, {width}) {dtype}")
    if norm_weight is not None and (norm_weight.shape != (width,) or norm_weight.dtype != dtype):
        raise ValueError(f"{op}: norm_weight {tuple(norm_weight.shape)} {norm_weight.dtype}, expected ({width},) {dtype}")
    return (None if residual is None else residual.contiguous(),
            None if norm_weight is None else norm_weight.contiguous())


def finish_block(width: int) -> int:
    """BLOCK_W of `_finish_rows`: the whole output row in one tile."""
    return triton.next_power_of_2(width)


FINISH_TILE = 4096   # most elements of one `_finish_rows` tile (fp32 values held by the last program at once)


def finish_rows(rows: int, width: int) -> int:
    """BLOCK_T of `_finish_rows` for `rows` rows of `width`: as many rows per tile as FINISH_TILE elements hold (at
    least one; a power of two, at most rows rounded up). FINISH_TILE 0 finishes one row at a time (as before run
    29; benchmark A/B)."""
    return max(1, min(triton.next_power_of_2(rows), FINISH_TILE // finish_block(width)))
