"""M-RoPE, Qwen3-Omni's 3-section rotary position embedding (Triton kernel + PyTorch reference).

Each token has three positions (temporal, height, width; all equal for text). Frequency j of the D/2
rotary frequencies takes its angle from one of the three axes:
  interleaved (Qwen3-Omni, mrope_section [24, 20, 20]): j % 3 == 1 and j < 3*s1 -> height,
      j % 3 == 2 and j < 3*s2 -> width, every other j -> temporal
      (transformers Qwen3OmniMoeThinkerTextRotaryEmbedding.recomposition_frequencies);
  contiguous (Qwen2-VL / Qwen2.5-Omni): the first s0 frequencies temporal, the next s1 height, the last
      s2 width (transformers Qwen2VLRotaryEmbedding.recomposition_frequencies).
The rotation is the "rotate half" form: out = x * cos + rotate_half(x) * sin with cos/sin repeated over
both halves of the head dim, cos/sin cast to x's dtype first (transformers apply_rotary_pos_emb).
"""
from __future__ import annotations

import torch

from .backend import helper, kernel, round_to, rounded, select, tl, triton


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0):
    """Per-axis rotary tables: positions int [3, N] (or [N] for plain RoPE), inv_freq fp32 [D/2]
    -> (cos, sin) fp32 [3, N, D/2] (or [N, D/2]); the inputs `apply_mrope` takes."""
    freqs = positions[..., None].float() * inv_freq.float()
    return freqs.cos() * scaling, freqs.sin() * scaling


def mrope_axis(half: int, mrope_section, interleaved: bool) -> torch.Tensor:
    """int64 [half]: which axis (0 temporal, 1 height, 2 width) frequency j takes its angle from."""
    j = torch.arange(half)
    if interleaved:
        _, s1, s2 = mrope_section
        return torch.where((j % 3 == 1) & (j < 3 * s1), 1, torch.where((j % 3 == 2) & (j < 3 * s2), 2, 0))
    s0, s1, _ = mrope_section
    return torch.where(j < s0, 0, torch.where(j < s0 + s1, 1, 2))


def _select_axes(table: torch.Tensor, mrope_section, interleaved: bool) -> torch.Tensor:
    """[3, N, D/2] per-axis table -> [N, D/2] with each frequency from its axis ([N, D/2] passes through)."""
    if mrope_section is None:
        return table
    axis = mrope_axis(table.shape[-1], mrope_section, interleaved).to(table.device)
    return table.gather(0, axis.expand(1, *table.shape[1:]))[0]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_mrope_reference(q, k, cos, sin, mrope_section=(24, 20, 20), interleaved=True):
    """PyTorch reference of `apply_mrope` (same arguments and results)."""
    out = []
    for x in (q, k):
        n = x.shape[:-2].numel()
        mrope = mrope_section is not None
        c = _select_axes(_tables(cos, n, mrope), mrope_section, interleaved).to(x.dtype)
        s = _select_axes(_tables(sin, n, mrope), mrope_section, interleaved).to(x.dtype)
        c = torch.cat((c, c), -1).reshape(*x.shape[:-2], 1, x.shape[-1])
        s = torch.cat((s, s), -1).reshape(*x.shape[:-2], 1, x.shape[-1])
        out.append(x * c + _rotate_half(x) * s)
    return out[0], out[1]


def _tables(table: torch.Tensor, n: int, mrope: bool) -> torch.Tensor:
    """cos/sin [3, ..., D/2] (M-RoPE) or [..., D/2] (plain) -> [3, n, D/2] or [n, D/2]."""
    return table.reshape(3, n, table.shape[-1]) if mrope else table.reshape(n, table.shape[-1])


@helper
def _rotate_heads(src_ptr, dst_ptr, t, H, stride_t, stride_h, c, s, j, jmask, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr):
    # the H heads of token t: [x1, x2] -> [x1*c - x2*s, x2*c + x1*s], rounded like the unfused code
    dt = dst_ptr.dtype.element_ty
    h = tl.arange(0, BLOCK_H)
    mask = (h[:, None] < H) & jmask[None, :]
    src = src_ptr + t * stride_t + h[:, None] * stride_h + j[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + (t * H + h[:, None]) * (2 * HALF) + j[None, :]
    tl.store(dst, round_to(rounded(x1 * c, dt) - rounded(x2 * s, dt), dt), mask=mask)
    tl.store(dst + HALF, round_to(rounded(x2 * c, dt) + rounded(x1 * s, dt), dt), mask=mask)


@kernel
def _mrope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, HQ, HK, q_stride_t, q_stride_h, k_stride_t,
                  k_stride_h, cos_stride_a, cos_stride_t, S0, S1, S2, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, MROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    # One program per token: its q and k heads, rotated by its three-axis angles.
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    jmask = j < HALF
    if MROPE:
        if INTERLEAVED:
            axis = tl.where((j % 3 == 1) & (j < 3 * S1), 1, tl.where((j % 3 == 2) & (j < 3 * S2), 2, 0))
        else:
            axis = tl.where(j < S0, 0, tl.where(j < S0 + S1, 1, 2))
    else:
        axis = tl.zeros([BLOCK_HALF], tl.int32)
    table = axis * cos_stride_a + t * cos_stride_t + j
    dt = qo_ptr.dtype.element_ty
    c = rounded(tl.load(cos_ptr + table, mask=jmask, other=0.0).to(tl.float32), dt)[None, :]
    s = rounded(tl.load(sin_ptr + table, mask=jmask, other=0.0).to(tl.float32), dt)[None, :]
    _rotate_heads(q_ptr, qo_ptr, t, HQ, q_stride_t, q_stride_h, c, s, j, jmask, HALF, BLOCK_HQ)
    _rotate_heads(k_ptr, ko_ptr, t, HK, k_stride_t, k_stride_h, c, s, j, jmask, HALF, BLOCK_HK)


def apply_mrope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mrope_section=(24, 20, 20), interleaved: bool = True):
    """Rotate q and k by their tokens' multimodal rotary angles.

    q: [..., Hq, D], k: [..., Hk, D] (same leading token dims N, same dtype, head dim contiguous; strided
    views of a fused qkv projection are fine); cos, sin: fp32/bf16 [3, ..., D/2] per-axis tables
    (`rotary_cos_sin`), or [..., D/2] with mrope_section=None for plain RoPE (e.g. the code predictor).
    mrope_section: 3 ints summing to D/2 ((24, 20, 20) for Qwen3-Omni); interleaved: Qwen3-Omni's layout
    (True) or Qwen2-VL's contiguous sections (False). Returns new (q, k) tensors, contiguous, q's dtype.
    Raises ValueError on mismatched shapes or sections. Source: transformers Qwen3OmniMoe
    ThinkerTextRotaryEmbedding + apply_rotary_pos_emb.
    """
    D = q.shape[-1]
    half = D // 2
    n = q.shape[:-2].numel()
    ok = D % 2 == 0 and k.shape[-1] == D and k.shape[:-2].numel() == n and cos.shape == sin.shape
    ok = ok and cos.shape[-1] == half and cos.numel() == (n * half if mrope_section is None else 3 * n * half)
    if mrope_section is not None:
        ok = ok and len(mrope_section) == 3 and sum(mrope_section) == half
    if not ok:
        raise ValueError(f"apply_mrope: q {tuple(q.shape)}, k {tuple(k.shape)}, cos {tuple(cos.shape)}, "
                         f"sin {tuple(sin.shape)}, mrope_section {mrope_section}")
    backend = select("apply_mrope", q, k, cos, sin)
    if backend == "reference" or n == 0:
        return apply_mrope_reference(q, k, cos, sin, mrope_section, interleaved)
    q3 = _heads(q, n)
    k3 = _heads(k, n)
    cos2 = _tables(cos, n, mrope_section is not None).contiguous()
    sin2 = _tables(sin, n, mrope_section is not None).contiguous()
    if mrope_section is None:
        cos2, sin2 = cos2[None], sin2[None]
        s0 = s1 = s2 = 0
    else:
        s0, s1, s2 = (int(s) for s in mrope_section)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    HQ, HK = q3.shape[1], k3.shape[1]
    block_hq, block_hk = triton.next_power_of_2(HQ), triton.next_power_of_2(HK)
    block_half = triton.next_power_of_2(half)
    warps = max(1, min(8, block_hq * block_half // 512))
    _mrope_kernel[(n,)](
        q3, k3, cos2, sin2, q_out, k_out, HQ, HK, q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
        cos2.stride(0), cos2.stride(1), s0, s1, s2, HALF=half, BLOCK_HALF=block_half, BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk, MROPE=mrope_section is not None, INTERLEAVED=bool(interleaved), num_warps=warps)
    return q_out, k_out


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """[..., H, D] as [n, H, D] with a unit inner stride (a view when the layout allows)."""
    x3 = x.reshape(n, x.shape[-2], x.shape[-1])
    return x3 if x3.stride(-1) == 1 else x3.contiguous()
