"""RMSNorm with an optional fused residual add (Triton kernel + PyTorch reference).

Numerics follow transformers' Qwen3OmniMoe RMSNorm (`Qwen3OmniMoeThinkerTextRMSNorm`, also the talker's
and code predictor's): variance in fp32, the normalised row cast back to the input dtype, then times the
weight in the promoted dtype. With a residual, `x + residual` is rounded to the input dtype first (as the
decoder layer's `residual + hidden_states` is) and is returned too, for the next layer's residual.
"""
from __future__ import annotations

import torch

from .backend import grid_dependency, kernel, pdl_for, round_to, rounded, select, tl, triton

MAX_HIDDEN = 32768  # one row lives in registers; wider rows use the reference


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None):
    """PyTorch reference of `rms_norm` (same arguments and results)."""
    if residual is not None:
        x = x + residual
    variance = x.float().pow(2).mean(-1, keepdim=True)
    out = weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)
    return out if residual is None else (out, x)


@kernel
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, M, H, x_stride, res_stride, out_stride, sum_stride,
                     eps, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
                     PDL: tl.constexpr):
    grid_dependency(PDL)
    # BLOCK_M rows of one program; each row whole in registers (16-byte vectors along the hidden dim).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_H)
    rows64 = rows.to(tl.int64)[:, None]
    mask = (rows[:, None] < M) & (cols[None, :] < H)
    x = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows64 * res_stride + cols[None, :], mask=mask, other=0.0)
        x = round_to(x.to(tl.float32) + r.to(tl.float32), x_ptr.dtype.element_ty)
        tl.store(sum_ptr + rows64 * sum_stride + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt_rn(tl.sum(xf * xf, axis=1) / H + eps)
    normed = rounded(xf * rstd[:, None], x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows64 * out_stride + cols[None, :], round_to(normed * w[None, :], out_ptr.dtype.element_ty),
             mask=mask)


def _launch_shape(M: int, H: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_H, num_warps): ~2k elements a program, 8 elements (16 bytes of bf16) a thread."""
    block_h = triton.next_power_of_2(H)
    block_m = max(1, min(triton.next_power_of_2(M), 2048 // block_h))
    warps = max(1, min(16, block_m * block_h // 256))
    return block_m, block_h, warps


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm over the last dim, optionally after a fused residual add.

    x: [..., H] bf16/fp16/fp32 (last dim contiguous); weight: [H]; residual: like x or None.
    Returns `out` [..., H] in the promoted dtype of weight and x, or `(out, x + residual)` when a residual
    is given (the sum in x's dtype). Raises ValueError on mismatched shapes.
    Source: transformers Qwen3OmniMoeThinkerTextRMSNorm (and the decoder layer's residual add).
    """
    H = x.shape[-1]
    if weight.shape != (H,) or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"rms_norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
                         f"residual {None if residual is None else tuple(residual.shape)}")
    tensors = (x, weight) if residual is None else (x, weight, residual)
    backend = select("rms_norm", *tensors)
    if backend == "reference" or H > MAX_HIDDEN or x.numel() == 0:
        return rms_norm_reference(x, weight, eps, residual)
    x2 = _rows(x)
    M = x2.shape[0]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is not None:
        r2 = _rows(residual)
        summed = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        r2 = summed = x2  # unused by the kernel
    block_m, block_h, warps = _launch_shape(M, H)
    pdl = pdl_for(x.device, M)
    _rms_norm_kernel[(triton.cdiv(M, block_m),)](
        x2, r2, weight.contiguous(), out, summed, M, H, x2.stride(0), r2.stride(0), H, H, float(eps),
        HAS_RESIDUAL=residual is not None, BLOCK_M=block_m, BLOCK_H=block_h, PDL=pdl, launch_pdl=pdl,
        num_warps=warps)
    return out if residual is None else (out, summed)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., H] as a [M, H] view with a unit inner stride (copies only if it must)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()
