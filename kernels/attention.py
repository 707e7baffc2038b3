"""One decode step of Qwen3 attention in one launch: q/k RMSNorm, RoPE, the static-cache write, and
grouped-query attention (Triton kernel + PyTorch reference).

A Qwen3 decoder layer's attention for one new token per row is, unfused: RMSNorm of each q head and of
each k head (`q_norm`, `k_norm`, per head over head_dim), rotary embedding of q and k, writing the new
key and value into the KV cache, and softmax(q K^T * scale) V over the row's cached columns with the
`G = Hq / Hk` query heads of one kv head sharing its keys. That is 6-9 kernel launches of a few KB each
(two norms, RoPE, two index_put, SDPA with a boolean mask), a large part of a launch-bound decode step.
`decode_attention` does all of it in one launch (two for long caches: a split-K combine).

Layout (the engine's `StaticKVCache`): key_cache / value_cache [slots, Hk, L, D]; row b of the step lives
in slot b and writes its new key/value at column `written[b]`, then attends columns 0..written[b].

Kernel: one program per (row, kv head, column split). It loads the G query heads of its kv head (padded
to 16 rows for the tensor cores), normalises and rotates them (and the new key) in registers with the
unfused code's bf16 roundings (`rms_norm`, `apply_mrope`), and starts an online softmax with the new
key/value held in registers (the split that owns column written[b] also stores them to the cache), then
streams its columns of cached keys and values in BLOCK_C tiles (`tl.dot`: [16, D] x [D, BLOCK_C] and
[16, BLOCK_C] x [BLOCK_C, D], fp32 accumulation). Caches longer than SPLIT_COLUMNS are split over
programs (flash-decoding); a second launch merges the splits' (max, sum, accumulator).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import DOT_IN_FP32, grid_dependency, kernel, pdl_for, round_to, rounded, select, tl, triton
from .norm import rms_norm_reference
from .rotary import apply_mrope_reference

SPLIT_COLUMNS = 512   # cached columns per program; longer caches are split and merged by a second launch
BLOCK_C = 64          # columns per tile


def decode_attention_reference(q, k, v, q_weight, k_weight, eps, cos, sin, key_cache, value_cache, written,
                               columns: int, scale: float):
    """PyTorch reference of `decode_attention` (same arguments and results; writes the caches too)."""
    batch, hq, d = q.shape
    hk = k.shape[1]
    q = rms_norm_reference(q, q_weight, eps)
    k = rms_norm_reference(k, k_weight, eps)
    q, k = apply_mrope_reference(q, k, cos, sin, mrope_section=None)
    rows = torch.arange(batch, device=q.device)
    key_cache[rows, :, written] = k
    value_cache[rows, :, written] = v
    mask = (torch.arange(columns, device=q.device)[None, :] <= written[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q.reshape(batch, hk, hq // hk, d), key_cache[:batch, :, :columns],
                                         value_cache[:batch, :, :columns], attn_mask=mask, scale=scale)
    return out.reshape(batch, hq, d)


@kernel
def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, written_ptr,
                             out_ptr, m_ptr, l_ptr, acc_ptr, HK, eps, scale, split_cols,
                             q_sb, q_sh, k_sb, k_sh, v_sb, v_sh, cos_sb, c_ss, c_sh, c_sl,
                             G: tl.constexpr, HALF: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
                             SPLITS: tl.constexpr, DOT_F32: tl.constexpr, DOT_PRECISION: tl.constexpr,
                             PDL: tl.constexpr):
    grid_dependency(PDL)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid // HK).to(tl.int64)
    hk = pid % HK
    dt = q_ptr.dtype.element_ty
    written = tl.load(written_ptr + b).to(tl.int32)
    g = tl.arange(0, BLOCK_G)
    j = tl.arange(0, HALF)
    g_ok = g < G
    # the G query heads of this kv head and the new key: RMSNorm over head_dim, then RoPE (rotate half)
    q_rows = q_ptr + b * q_sb + (hk * G + g)[:, None] * q_sh + j[None, :]
    q1 = tl.load(q_rows, mask=g_ok[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(q_rows + HALF, mask=g_ok[:, None], other=0.0).to(tl.float32)
    k_row = k_ptr + b * k_sb + hk * k_sh + j
    k1 = tl.load(k_row).to(tl.float32)
    k2 = tl.load(k_row + HALF).to(tl.float32)
    c = rounded(tl.load(cos_ptr + b * cos_sb + j).to(tl.float32), dt)
    s = rounded(tl.load(sin_ptr + b * cos_sb + j).to(tl.float32), dt)
    qw1 = tl.load(qw_ptr + j).to(tl.float32)
    qw2 = tl.load(qw_ptr + HALF + j).to(tl.float32)
    kw1 = tl.load(kw_ptr + j).to(tl.float32)
    kw2 = tl.load(kw_ptr + HALF + j).to(tl.float32)
    q_rstd = 1.0 / tl.sqrt_rn((tl.sum(q1 * q1, axis=1) + tl.sum(q2 * q2, axis=1)) / (2 * HALF) + eps)
    q1 = rounded(rounded(q1 * q_rstd[:, None], dt) * qw1[None, :], dt)
    q2 = rounded(rounded(q2 * q_rstd[:, None], dt) * qw2[None, :], dt)
    k_rstd = 1.0 / tl.sqrt_rn((tl.sum(k1 * k1, axis=0) + tl.sum(k2 * k2, axis=0)) / (2 * HALF) + eps)
    k1 = rounded(rounded(k1 * k_rstd, dt) * kw1, dt)
    k2 = rounded(rounded(k2 * k_rstd, dt) * kw2, dt)
    rq1 = rounded(rounded(q1 * c[None, :], dt) - rounded(q2 * s[None, :], dt), dt)
    rq2 = rounded(rounded(q2 * c[None, :], dt) + rounded(q1 * s[None, :], dt), dt)
    rk1 = rounded(rounded(k1 * c, dt) - rounded(k2 * s, dt), dt)
    rk2 = rounded(rounded(k2 * c, dt) + rounded(k1 * s, dt), dt)
    v_row = v_ptr + b * v_sb + hk * v_sh + j
    v1 = tl.load(v_row).to(tl.float32)
    v2 = tl.load(v_row + HALF).to(tl.float32)
    # the split holding column `written` stores the new key/value and starts its softmax with them
    cache = b * c_ss + hk * c_sh
    own = split == written // split_cols
    tl.store(kc_ptr + cache + written * c_sl + j, round_to(rk1, dt), mask=(j < HALF) & own)
    tl.store(kc_ptr + cache + written * c_sl + HALF + j, round_to(rk2, dt), mask=(j < HALF) & own)
    tl.store(vc_ptr + cache + written * c_sl + j, round_to(v1, dt), mask=(j < HALF) & own)
    tl.store(vc_ptr + cache + written * c_sl + HALF + j, round_to(v2, dt), mask=(j < HALF) & own)
    s_new = (tl.sum(rq1 * rk1[None, :], axis=1) + tl.sum(rq2 * rk2[None, :], axis=1)) * scale
    m_i = tl.where(own, s_new, float("-inf"))
    l_i = tl.where(own, 1.0, 0.0) + tl.zeros([BLOCK_G], tl.float32)
    acc1 = tl.where(own, v1[None, :] + tl.zeros([BLOCK_G, HALF], tl.float32), 0.0)
    acc2 = tl.where(own, v2[None, :] + tl.zeros([BLOCK_G, HALF], tl.float32), 0.0)
    a1 = round_to(rq1, dt)
    a2 = round_to(rq2, dt)
    if DOT_F32:
        a1, a2 = a1.to(tl.float32), a2.to(tl.float32)
    # cached columns [start, end) of this split, before the new one
    start = split * split_cols
    end = tl.minimum(start + split_cols, written)
    cols = tl.arange(0, BLOCK_C)
    for c0 in range(start, end, BLOCK_C):
        col = c0 + cols
        c_ok = col < end
        kt = kc_ptr + cache + col[None, :] * c_sl + j[:, None]        # [HALF, BLOCK_C] (transposed keys)
        kt1 = tl.load(kt, mask=c_ok[None, :], other=0.0)
        kt2 = tl.load(kt + HALF, mask=c_ok[None, :], other=0.0)
        if DOT_F32:
            kt1, kt2 = kt1.to(tl.float32), kt2.to(tl.float32)
        scores = tl.dot(a1, kt1, input_precision=DOT_PRECISION)
        scores = tl.dot(a2, kt2, scores, input_precision=DOT_PRECISION) * scale
        scores = tl.where(c_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = vc_ptr + cache + col[:, None] * c_sl + j[None, :]        # [BLOCK_C, HALF]
        vt1 = tl.load(vt, mask=c_ok[:, None], other=0.0)
        vt2 = tl.load(vt + HALF, mask=c_ok[:, None], other=0.0)
        pv = round_to(p, dt)
        if DOT_F32:
            pv, vt1, vt2 = pv.to(tl.float32), vt1.to(tl.float32), vt2.to(tl.float32)
        acc1 = tl.dot(pv, vt1, acc1 * alpha[:, None], input_precision=DOT_PRECISION)
        acc2 = tl.dot(pv, vt2, acc2 * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    heads = (b * HK + hk) * G + g                                      # flat (row, q head) index
    if SPLITS == 1:
        out = out_ptr + heads[:, None] * (2 * HALF) + j[None, :]
        tl.store(out, round_to(acc1 / l_i[:, None], dt), mask=g_ok[:, None])
        tl.store(out + HALF, round_to(acc2 / l_i[:, None], dt), mask=g_ok[:, None])
    else:
        part = heads * SPLITS + split
        tl.store(m_ptr + part, m_i, mask=g_ok)
        tl.store(l_ptr + part, l_i, mask=g_ok)
        acc = acc_ptr + part[:, None] * (2 * HALF) + j[None, :]
        tl.store(acc, acc1, mask=g_ok[:, None])
        tl.store(acc + HALF, acc2, mask=g_ok[:, None])


@kernel
def _merge_splits_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, D: tl.constexpr, SPLITS: tl.constexpr,
                         BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    # one (row, q head): out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)
    grid_dependency(PDL)
    head = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, BLOCK_S)
    s_ok = sp < SPLITS
    d = tl.arange(0, D)
    m = tl.load(m_ptr + head * SPLITS + sp, mask=s_ok, other=float("-inf"))
    big = tl.max(m, axis=0)
    w = tl.where(s_ok & (m > float("-inf")), tl.exp(m - big), 0.0)
    total = tl.sum(tl.load(l_ptr + head * SPLITS + sp, mask=s_ok, other=0.0) * w, axis=0)
    acc = tl.load(acc_ptr + (head * SPLITS + sp)[:, None] * D + d[None, :], mask=s_ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / total
    tl.store(out_ptr + head * D + d, round_to(out, out_ptr.dtype.element_ty))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                     k_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                     key_cache: torch.Tensor, value_cache: torch.Tensor, written: torch.Tensor, columns: int,
                     scale: float) -> torch.Tensor:
    """One new token per row through Qwen3 attention, writing its key/value into a static cache.

    q: [B, Hq, D], k, v: [B, Hk, D] (the q/k/v projections; strided views of one fused qkv GEMM are fine,
    head dim contiguous), bf16/fp16/fp32; q_weight, k_weight: [D] (`q_norm`, `k_norm` weights), eps their
    epsilon; cos, sin: [B, D/2] the rows' rotary tables in q's dtype (plain RoPE; text positions of
    M-RoPE); key_cache, value_cache: [S >= B, Hk, L, D] in q's dtype, head dim contiguous, row b in slot b;
    written: int64 [B], the column where row b's new key/value go (< L); columns: attended columns are
    0..written[b] and written[b] < columns <= L (the decode graph's column bucket); scale: softmax scale.
    Returns [B, Hq, D] in q's dtype (the attention output before o_proj); writes both caches.
    Raises ValueError on mismatched shapes. Source: transformers Qwen3OmniMoeThinkerTextAttention
    (q_norm / k_norm, apply_rotary_pos_emb, eager_attention_forward with repeat_kv).
    """
    batch, hq, d = q.shape
    hk = k.shape[1] if k.dim() == 3 else 0
    ok = k.shape == v.shape == (batch, hk, d) and hk > 0 and hq % hk == 0 and d % 2 == 0
    ok = ok and q_weight.shape == k_weight.shape == (d,) and cos.shape == sin.shape == (batch, d // 2)
    ok = ok and key_cache.shape == value_cache.shape and key_cache.dim() == 4 and key_cache.shape[0] >= batch
    ok = ok and key_cache.shape[1] == hk and key_cache.shape[3] == d and written.shape == (batch,)
    ok = ok and 0 < columns <= key_cache.shape[2] and key_cache.dtype == value_cache.dtype == q.dtype
    if not ok:
        raise ValueError(f"decode_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"weights {tuple(q_weight.shape)}/{tuple(k_weight.shape)}, cos {tuple(cos.shape)}, "
                         f"caches {tuple(key_cache.shape)}/{tuple(value_cache.shape)}, written "
                         f"{tuple(written.shape)}, columns {columns}")
    backend = select("decode_attention", q, k, v, key_cache, value_cache, written)
    if backend == "reference" or batch == 0 or d & (d - 1) or key_cache.stride() != value_cache.stride():
        return decode_attention_reference(q, k, v, q_weight, k_weight, eps, cos, sin, key_cache, value_cache,
                                          written, columns, scale)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    cos, sin = cos.contiguous(), sin.contiguous()
    group = hq // hk
    splits = triton.cdiv(columns, SPLIT_COLUMNS)
    out = torch.empty((batch, hq, d), dtype=q.dtype, device=q.device)
    f32 = dict(dtype=torch.float32, device=q.device)
    if splits > 1:
        m, l = torch.empty(batch * hq * splits, **f32), torch.empty(batch * hq * splits, **f32)
        acc = torch.empty(batch * hq * splits, d, **f32)
    else:
        m = l = acc = out   # unused
    pdl = pdl_for(q.device, batch)
    _decode_attention_kernel[(batch * hk, splits)](
        q, k, v, q_weight.contiguous(), k_weight.contiguous(), cos, sin, key_cache, value_cache,
        written.contiguous(), out, m, l, acc, hk, float(eps), float(scale), SPLIT_COLUMNS,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        G=group, HALF=d // 2, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_C=BLOCK_C, SPLITS=splits,
        DOT_F32=DOT_IN_FP32, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PDL=pdl,
        launch_pdl=pdl, num_warps=4)
    if splits > 1:
        _merge_splits_kernel[(batch * hq,)](m, l, acc, out, D=d, SPLITS=splits,
                                            BLOCK_S=triton.next_power_of_2(splits), PDL=pdl, launch_pdl=pdl,
                                            num_warps=4)
    return out
