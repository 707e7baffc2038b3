"""SiLU-and-mul, the gated activation of Qwen3-Omni's MLPs (Triton kernel + PyTorch reference).

`silu_and_mul(x) = silu(x[..., :d]) * x[..., d:]` on a concatenated [gate | up] projection. The kernel
rounds where the unfused PyTorch code does (silu's result to the input dtype, then the product), so its
output equals `F.silu(gate) * up` up to the last bit of silu's fp32 evaluation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import grid_dependency, kernel, pdl_for, round_to, rounded, select, tl, triton


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """PyTorch reference of `silu_and_mul`."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


@kernel
def _silu_and_mul_kernel(x_ptr, out_ptr, D, x_stride, out_stride, BLOCK: tl.constexpr, PDL: tl.constexpr):
    grid_dependency(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + D + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    tl.store(out_ptr + row * out_stride + cols, round_to(rounded(gate * tl.sigmoid(gate), dt) * up, dt), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x: [..., 2d] bf16/fp16/fp32 (gate first, then up; last dim contiguous) -> [..., d] in x's dtype.

    Raises ValueError if the last dim is odd. Source: transformers Qwen3OmniMoeMLP / TalkerTextMLP
    (`act_fn(gate_proj(x)) * up_proj(x)` with the two projections concatenated).
    """
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: last dim {x.shape[-1]} is odd")
    backend = select("silu_and_mul", x)
    if backend == "reference" or x.numel() == 0:
        return silu_and_mul_reference(x)
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(d))
    grid = (x2.shape[0], triton.cdiv(d, block))
    pdl = pdl_for(x.device, x2.shape[0])
    _silu_and_mul_kernel[grid](x2, out, d, x2.stride(0), d, BLOCK=block, PDL=pdl, launch_pdl=pdl,
                               num_warps=max(1, block // 256))
    return out
