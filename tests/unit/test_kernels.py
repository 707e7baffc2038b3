"""omni_kernels: every kernel against its PyTorch reference, and every reference against transformers.

Without CUDA the kernels run in Triton's interpreter on small shapes (CI); with CUDA the same tests run the
compiled kernels on the Qwen3-Omni-30B-A3B decode and prefill shapes (docs/kernels.md, "Tests").
Each check draws fresh random inputs (never zeros), runs the op with every buffer it allocates poisoned
(NaN / huge ints), and compares ||out - ref|| / ||ref|| with the tolerance stated in TOL.
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import omni_kernels as ok
from omni_kernels import attention, backend, moe_routing
from omni_kernels.linear_decode import LinearConfig
from omni_kernels.moe_configs import DecodeConfig, GemmConfig, MoeConfig

# Triton 3.6's interpreter converts 1-element arrays to ints the way numpy 1.25+ deprecates
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
KERNEL_BACKEND = "triton" if CUDA else "interpreter"
needs_triton = pytest.mark.skipif(not backend.HAVE_TRITON, reason="Triton is not installed (the `dev` extra)")
BF16, FP32 = torch.bfloat16, torch.float32

# Relative-norm tolerance per kernel and dtype. The elementwise kernels round where PyTorch rounds, so
# they land near bit-equality; fused_moe's GEMMs sum in another order than torch's matmul, so bf16
# outputs differ by a last-bit rounding in some elements (about 1e-3 relative).
TOL = {
    "rms_norm": {FP32: 1e-6, BF16: 1e-2},
    "silu_and_mul": {FP32: 1e-6, BF16: 1e-2},
    "apply_mrope": {FP32: 1e-6, BF16: 1e-2},
    "fused_moe": {FP32: 1e-5, BF16: 1e-2},
    "decode_linear": {FP32: 1e-5, BF16: 1e-2},
    "decode_attention": {FP32: 1e-5, BF16: 1e-2},
}


@pytest.fixture(autouse=True)
def kernels_enabled(monkeypatch):
    """Kernels on, CPU tensors through the interpreter; the switch is restored afterwards."""
    monkeypatch.setenv("OMNI_KERNELS_INTERPRET", "1")
    was = ok.enabled()
    ok.set_enabled(True)
    yield
    ok.set_enabled(was)


@contextlib.contextmanager
def poisoned_allocations():
    """Every buffer torch.empty/empty_like hands out meanwhile is NaN (floats) or 2**30 (ints), so an
    element the kernels forget to write shows up in the output."""
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan") if t.is_floating_point() else 2**30)

    torch.empty = lambda *a, **k: poison(real_empty(*a, **k))
    torch.empty_like = lambda *a, **k: poison(real_empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


def run_kernel(op: str, fn, *args, **kwargs):
    """Call an omni_kernels op with poisoned allocations; assert the kernel (not the reference) ran."""
    with poisoned_allocations():
        out = fn(*args, **kwargs)
    assert ok.last_backend(op) == KERNEL_BACKEND
    return out


def assert_close(op: str, out: torch.Tensor, ref: torch.Tensor):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert torch.isfinite(out).all(), f"{op}: unwritten or non-finite elements"
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err <= TOL[op][ref.dtype], f"{op} {ref.dtype} {tuple(ref.shape)}: relative error {err:.2e}"


def randn(*shape, dtype=BF16, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


# ---------------------------------------------------------------- rms_norm

RMS_SHAPES = [(1, 2048), (64, 2048), (4096, 2048), (64, 32, 128), (3, 1024)] if CUDA else \
    [(1, 64), (7, 96), (5, 4, 32), (33, 128)]


@needs_triton
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", RMS_SHAPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_matches_reference(shape, dtype, with_residual):
    x = randn(*shape, dtype=dtype, scale=3.0)
    w = randn(shape[-1], dtype=dtype)
    r = randn(*shape, dtype=dtype) if with_residual else None
    out = run_kernel("rms_norm", ok.rms_norm, x, w, 1e-6, r)
    ref = ok.rms_norm_reference(x, w, 1e-6, r)
    if with_residual:
        assert_close("rms_norm", out[0], ref[0])
        assert torch.equal(out[1], ref[1])  # the residual sum rounds exactly like torch's add
    else:
        assert_close("rms_norm", out, ref)


@needs_triton
def test_rms_norm_strided_rows_and_fp32_weight():
    # rows of a wider buffer (a view), bf16 input with an fp32 weight -> fp32 output, as transformers promotes
    base = randn(6, 160)
    x = base[:, 16:144]
    w = randn(128, dtype=FP32)
    out = run_kernel("rms_norm", ok.rms_norm, x, w, 1e-5)
    assert out.dtype == FP32
    assert_close("rms_norm", out, ok.rms_norm_reference(x, w, 1e-5))


# ---------------------------------------------------------------- silu_and_mul

SILU_SHAPES = [(1, 1536), (64, 6144), (8192, 1536)] if CUDA else [(1, 64), (5, 3, 200), (9, 2048)]


@needs_triton
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", SILU_SHAPES, ids=str)
def test_silu_and_mul_matches_reference(shape, dtype):
    x = randn(*shape, dtype=dtype, scale=2.0)
    assert_close("silu_and_mul", run_kernel("silu_and_mul", ok.silu_and_mul, x), ok.silu_and_mul_reference(x))


def test_silu_and_mul_rejects_odd_width():
    with pytest.raises(ValueError, match="odd"):
        ok.silu_and_mul(torch.randn(2, 7))


# ---------------------------------------------------------------- apply_mrope

# (tokens, q heads, kv heads, head dim, mrope_section)
MROPE_SHAPES = [(1, 32, 4, 128, (24, 20, 20)), (64, 32, 4, 128, (24, 20, 20)), (4096, 32, 4, 128, (24, 20, 20)),
                (16, 16, 2, 128, (24, 20, 20))] if CUDA else [(7, 4, 2, 32, (6, 5, 5)), (3, 3, 1, 48, (8, 8, 8))]


def mrope_inputs(T, HQ, HK, D, dtype):
    """q and k as strided views of one fused qkv projection, per-axis positions that differ."""
    qkv = randn(T, (HQ + 2 * HK) * D, dtype=dtype)
    q = qkv[:, :HQ * D].view(T, HQ, D)
    k = qkv[:, HQ * D:(HQ + HK) * D].view(T, HK, D)
    positions = torch.stack([torch.arange(T), torch.arange(T) // 2 + 3, torch.arange(T) % 5 + 7]).to(DEVICE)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2, dtype=FP32, device=DEVICE) / D))
    return q, k, positions, inv_freq


@needs_triton
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "contiguous"])
@pytest.mark.parametrize("shape", MROPE_SHAPES, ids=str)
def test_apply_mrope_matches_reference(shape, interleaved, dtype):
    T, HQ, HK, D, section = shape
    q, k, positions, inv_freq = mrope_inputs(T, HQ, HK, D, dtype)
    cos, sin = ok.rotary_cos_sin(positions, inv_freq)
    out = run_kernel("apply_mrope", ok.apply_mrope, q, k, cos, sin, section, interleaved)
    ref = ok.apply_mrope_reference(q, k, cos, sin, section, interleaved)
    assert_close("apply_mrope", out[0], ref[0])
    assert_close("apply_mrope", out[1], ref[1])


@needs_triton
def test_apply_mrope_plain_rope():
    # mrope_section None: one position per token and [T, D/2] tables (the code predictor's RoPE)
    q, k, positions, inv_freq = mrope_inputs(5, 4, 2, 32, BF16)
    cos, sin = ok.rotary_cos_sin(positions[0], inv_freq)
    out = run_kernel("apply_mrope", ok.apply_mrope, q, k, cos.to(BF16), sin.to(BF16), None)
    ref = ok.apply_mrope_reference(q, k, cos.to(BF16), sin.to(BF16), None)
    assert_close("apply_mrope", out[0], ref[0])
    assert_close("apply_mrope", out[1], ref[1])


def test_apply_mrope_rejects_bad_sections():
    q, k = torch.randn(3, 2, 32), torch.randn(3, 1, 32)
    cos = torch.randn(3, 3, 16)
    with pytest.raises(ValueError, match="mrope_section"):
        ok.apply_mrope(q, k, cos, cos, (6, 5, 4))


# ---------------------------------------------------------------- decode_attention

# (rows, q heads, kv heads, head dim, cache length, attended columns): thinker 32/4, talker 16/2 and code
# predictor 16/8 heads of 128; 4096 columns take the split path (SPLIT_COLUMNS) and its merge launch.
ATTN_SHAPES = [(1, 32, 4, 128, 4096, 256), (16, 32, 4, 128, 4096, 4096), (1, 16, 2, 128, 4608, 256),
               (32, 16, 2, 128, 4608, 1024), (16, 16, 8, 128, 16, 16)] if CUDA else \
    [(3, 8, 2, 32, 80, 70), (2, 4, 4, 32, 20, 17)]


def attention_inputs(B, HQ, HK, D, L, columns, dtype):
    """q/k/v as strided views of one fused projection, norm weights, per-row rotary tables, caches with a
    spare slot, and new-token columns (row 0 at the last attended column)."""
    qkv = randn(B, (HQ + 2 * HK) * D, dtype=dtype, scale=2.0)
    q, k, v = (t.view(B, -1, D) for t in qkv.split([HQ * D, HK * D, HK * D], -1))
    weights = randn(D, dtype=dtype), randn(D, dtype=dtype)
    angles = torch.rand(B, D // 2, device=DEVICE) * 100
    caches = randn(B + 1, HK, L, D, dtype=dtype), randn(B + 1, HK, L, D, dtype=dtype)
    written = torch.randint(0, columns, (B,), device=DEVICE)
    written[0] = columns - 1
    return q, k, v, weights, angles.cos().to(dtype), angles.sin().to(dtype), caches, written


def check_decode_attention(shape, dtype):
    B, HQ, HK, D, L, columns = shape
    q, k, v, (qw, kw), cos, sin, (kc, vc), written = attention_inputs(B, HQ, HK, D, L, columns, dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    out = run_kernel("decode_attention", ok.decode_attention, q, k, v, qw, kw, 1e-6, cos, sin, kc, vc, written,
                     columns, D ** -0.5)
    ref = ok.decode_attention_reference(q, k, v, qw, kw, 1e-6, cos, sin, kc_ref, vc_ref, written, columns, D ** -0.5)
    assert_close("decode_attention", out, ref)
    rows = torch.arange(B, device=DEVICE)
    assert_close("decode_attention", kc[rows, :, written], kc_ref[rows, :, written])   # the new keys
    assert torch.equal(vc, vc_ref)   # values are stored as they come; nothing else is touched
    kc[rows, :, written] = kc_ref[rows, :, written]
    assert torch.equal(kc, kc_ref)


@needs_triton
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=str)
def test_decode_attention_matches_reference(shape, dtype):
    check_decode_attention(shape, dtype)


@needs_triton
def test_decode_attention_split_columns(monkeypatch):
    """Columns spread over several programs (flash-decoding) and merged by the second launch."""
    monkeypatch.setattr(attention, "SPLIT_COLUMNS", 32 if not CUDA else 128)
    check_decode_attention((3, 8, 2, 32, 80, 70) if not CUDA else (4, 32, 4, 128, 1024, 1000), BF16)


def test_decode_attention_rejects_mismatched_inputs():
    q, k, v, (qw, kw), cos, sin, (kc, vc), written = attention_inputs(2, 4, 2, 32, 20, 10, FP32)
    with pytest.raises(ValueError, match="decode_attention"):
        ok.decode_attention(q, k, v, qw, kw, 1e-6, cos, sin, kc, vc, written, 21, 0.1)   # columns > cache length
    with pytest.raises(ValueError, match="decode_attention"):
        ok.decode_attention(q[:, :3], k, v, qw, kw, 1e-6, cos, sin, kc, vc, written, 10, 0.1)   # 3 heads for 2 kv


# ---------------------------------------------------------------- fused_moe

def distinct_logits(T, E, dtype):
    """Router logits without ties (a random order of evenly spaced values, exact in bf16), so the top-k
    set is unambiguous: on ties torch.topk and the kernel may pick different experts."""
    ranks = torch.argsort(torch.rand(T, E, device=DEVICE), dim=1).float()
    return ((ranks - E / 2) / 16).to(dtype)


def moe_inputs(T, E, H, I, dtype):
    x = randn(T, H, dtype=dtype)
    w13 = randn(E, 2 * I, H, dtype=dtype, scale=H ** -0.5)
    w2 = randn(E, H, I, dtype=dtype, scale=I ** -0.5)
    return x, distinct_logits(T, E, dtype), w13, w2


# (tokens, experts, hidden, intermediate, top_k): thinker 128 experts top-8, H 2048, I 768; talker top-6,
# H 1024, I 384. CPU: the single-program routing path (<= 64 tokens) and the chunked one (100 tokens).
MOE_SHAPES = [(1, 128, 2048, 768, 8), (16, 128, 2048, 768, 8), (64, 128, 2048, 768, 8), (512, 128, 2048, 768, 8),
              (4096, 128, 2048, 768, 8), (1, 128, 1024, 384, 6), (16, 128, 1024, 384, 6)] if CUDA else \
    [(1, 16, 64, 32, 8), (5, 16, 64, 48, 6), (24, 16, 64, 32, 8), (100, 8, 32, 32, 2)]
# fp32 runs the same code paths: on CPU two shapes suffice (interpreter time)
MOE_CASES = [(shape, BF16) for shape in MOE_SHAPES] + [(shape, FP32) for shape in MOE_SHAPES[::1 if CUDA else 3]]


@needs_triton
@pytest.mark.parametrize("shape,dtype", MOE_CASES, ids=lambda v: "bf16" if v == BF16 else "fp32" if v == FP32
                         else str(v))
def test_fused_moe_matches_reference(shape, dtype):
    T, E, H, I, top_k = shape
    x, logits, w13, w2 = moe_inputs(T, E, H, I, dtype)
    out = run_kernel("fused_moe", ok.fused_moe, x, logits, w13, w2, top_k)
    assert_close("fused_moe", out, ok.fused_moe_reference(x, logits, w13, w2, top_k))


@needs_triton
@pytest.mark.parametrize("config", [
    MoeConfig(32, GemmConfig(32, 32, 2, 4, 2), GemmConfig(64, 32, 1, 4, 2)),  # K and N tails (H 80, I 48)
    MoeConfig(64, GemmConfig(64, 16, 1, 4, 3), GemmConfig(128, 16, 4, 4, 3)),  # each expert's slots in one block
], ids=["tails", "wide-block"])
def test_fused_moe_other_block_sizes(config):
    x, logits, w13, w2 = moe_inputs(21, 8, 80, 48, BF16)
    out = run_kernel("fused_moe", ok.fused_moe, x, logits, w13, w2, 3, config=config)
    assert_close("fused_moe", out, ok.fused_moe_reference(x, logits, w13, w2, 3))


@needs_triton
@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("T", [9, 100] if not CUDA else [9, 3000], ids=lambda t: f"T{t}")
def test_moe_routing_layout(T, renormalize):
    """Routing and alignment on their own: top-k ids/weights equal torch's; every slot appears exactly
    once, in a block of its expert; segments are BLOCK_M-aligned and in ascending expert order."""
    E, top_k, block_m = 16, 4, 8
    logits = distinct_logits(T, E, FP32)
    with poisoned_allocations():
        routing = moe_routing.moe_route(logits, top_k, renormalize, block_m)
    ref_w, ref_ids = ok.moe_topk_reference(logits, top_k, renormalize)
    order = ref_ids.sort(dim=1)
    assert torch.equal(routing.topk_ids.long(), order.values)
    torch.testing.assert_close(routing.topk_weights, ref_w.gather(1, order.indices), rtol=1e-6, atol=1e-7)

    experts, rows = routing.block_expert.cpu(), routing.block_rows.cpu()
    used = int((experts >= 0).sum())
    assert (experts[:used] >= 0).all() and (experts[used:] == -1).all() and (rows[used:] == 0).all()
    assert (experts[:used].diff() >= 0).all() and (rows[:used] > 0).all() and (rows[:used] <= block_m).all()
    slots = routing.sorted_slots.cpu().view(-1, block_m)
    flat_ids = routing.topk_ids.cpu().flatten()
    seen = []
    for b in range(used):
        block_slots = slots[b, :rows[b]]
        assert (flat_ids[block_slots.long()] == experts[b]).all()
        seen.append(block_slots)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(T * top_k, dtype=torch.int32))
    counts = torch.bincount(flat_ids.long(), minlength=E)
    assert used == int(((counts + block_m - 1) // block_m).sum())


REPEATS = 20 if CUDA else 1   # launches per check of the split-K kernels (their cross-program ordering)

# The one-launch decode path: tile widths, K/N/H tails, several tokens. CPU: small shapes; CUDA: the thinker's
# and talker's experts with the kinds of tiles the table uses.
DECODE_CASES = [((1, 128, 2048, 768, 8), DecodeConfig(64, 256, 512, 4, 3)),
                ((2, 128, 2048, 768, 8), DecodeConfig(32, 256, 512, 4, 4)),
                ((1, 128, 2048, 768, 8), DecodeConfig(16, 128, 256, 4, 3)),
                ((3, 128, 1024, 384, 6), DecodeConfig(32, 128, 128, 4, 3))] if CUDA else \
    [((1, 16, 64, 32, 8), DecodeConfig(16, 32, 16, 4, 1)),           # every slot of one token
     ((3, 16, 80, 48, 6), DecodeConfig(32, 32, 32, 4, 1)),           # K, N and H tails, three tokens
     ((2, 8, 64, 32, 2), DecodeConfig(16, 64, 64, 4, 1))]


def moe_norm_reference(x, logits, w13, w2, top_k, norm_weight, residual):
    return ok.rms_norm_reference(ok.fused_moe_reference(x, logits, w13, w2, top_k), norm_weight, 1e-6, residual)


@needs_triton
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"T{c[0][0]}-N{c[1].BLOCK_N}")
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_fused_moe_decode_path_matches_reference(case, dtype):
    """The one-launch path alone, and with the residual add + RMSNorm epilogue; one workspace serves every call
    and is left zeroed."""
    (T, E, H, I, top_k), config = case
    x, logits, w13, w2 = moe_inputs(T, E, H, I, dtype)
    workspace = ok.SplitKWorkspace(T + 1, H, DEVICE)
    norm_weight, residual = randn(H, dtype=dtype), randn(T, H, dtype=dtype)
    ref = ok.fused_moe_reference(x, logits, w13, w2, top_k)
    ref_normed, ref_summed = moe_norm_reference(x, logits, w13, w2, top_k, norm_weight, residual)
    for _ in range(REPEATS):   # the last program's read of the sums races with late atomics if misordered
        out = run_kernel("fused_moe", ok.fused_moe, x, logits, w13, w2, top_k, config=config, workspace=workspace)
        assert_close("fused_moe", out, ref)
        normed, summed = run_kernel("fused_moe", ok.fused_moe, x, logits, w13, w2, top_k, config=config,
                                    workspace=workspace, residual=residual, norm_weight=norm_weight)
        assert_close("fused_moe", summed, ref_summed)
        assert_close("fused_moe", normed, ref_normed)
    assert workspace.is_clean()


@needs_triton
def test_fused_moe_norm_epilogue_on_the_grouped_path():
    x, logits, w13, w2 = moe_inputs(21, 8, 80, 48, BF16)
    config = MoeConfig(32, GemmConfig(32, 32, 2, 4, 2), GemmConfig(64, 32, 1, 4, 2))
    norm_weight, residual = randn(80), randn(21, 80)
    normed, summed = run_kernel("fused_moe", ok.fused_moe, x, logits, w13, w2, 3, config=config, residual=residual,
                                norm_weight=norm_weight)
    ref_normed, ref_summed = moe_norm_reference(x, logits, w13, w2, 3, norm_weight, residual)
    assert_close("fused_moe", normed, ref_normed)
    assert_close("fused_moe", summed, ref_summed)


def test_fused_moe_rejects_mismatched_inputs():
    x, logits, w13, w2 = torch.randn(2, 8), torch.randn(2, 4), torch.randn(4, 12, 8), torch.randn(4, 8, 6)
    with pytest.raises(ValueError, match="fused_moe"):
        ok.fused_moe(x, logits, w13, w2[..., :5], 2)  # down_proj's I differs from gate_up's
    with pytest.raises(ValueError, match="fused_moe"):
        ok.fused_moe(x[None], logits[None], w13, w2, 2)  # tokens must be flattened to [T, H]
    with pytest.raises(ValueError, match="fused_moe"):
        ok.fused_moe(x, logits, w13, w2, 5)  # top_k > experts


@needs_triton
def test_fused_moe_decode_path_rejects_a_workspace_that_does_not_fit():
    x, logits, w13, w2 = moe_inputs(2, 8, 64, 32, BF16)
    config = DecodeConfig(16, 32, 32, 4, 1)
    with pytest.raises(ValueError, match="workspace"):
        ok.fused_moe(x, logits, w13, w2, 2, config=config, workspace=ok.SplitKWorkspace(1, 64, DEVICE))  # 2 tokens
    with pytest.raises(ValueError, match="workspace"):
        ok.fused_moe(x, logits, w13, w2, 2, config=config, workspace=ok.SplitKWorkspace(2, 32, DEVICE))  # width
    with pytest.raises(ValueError, match="norm_weight"):
        ok.fused_moe(x, logits, w13, w2, 2, config=config, residual=x)   # a residual without the norm


# ---------------------------------------------------------------- decode_linear

# (rows, in features K, out features N, config): thinker o_proj (4096 -> 2048), talker o_proj (2048 -> 1024),
# code predictor down_proj (3072 -> 1024); CPU: K tails and splits that leave a short last slice.
# SPLIT_K 1: the direct-store path for the plain linear (thinker q/k/v 2048 -> 5120 on CUDA).
LINEAR_CASES = [(1, 4096, 2048, None), (16, 4096, 2048, None), (1, 2048, 1024, None), (4, 3072, 1024, None),
                (3, 4096, 2048, LinearConfig(16, 256, 5, 4, 3)), (1, 2048, 5120, LinearConfig(32, 128, 1, 4, 3)),
                (5, 2048, 5120, LinearConfig(64, 256, 1, 4, 3))] if CUDA else \
    [(1, 96, 48, LinearConfig(16, 32, 2)), (5, 80, 40, LinearConfig(16, 32, 3)), (16, 64, 32, None),
     (3, 80, 48, LinearConfig(32, 32, 1))]


@needs_triton
@pytest.mark.parametrize("case", LINEAR_CASES, ids=lambda c: f"T{c[0]}-K{c[1]}-N{c[2]}")
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_decode_linear_matches_reference(case, dtype):
    """The plain linear, with the norm epilogue, and with the residual add + norm; one workspace for all."""
    T, K, N, config = case
    x, weight = randn(T, K, dtype=dtype), randn(N, K, dtype=dtype, scale=K ** -0.5)
    norm_weight, residual = randn(N, dtype=dtype), randn(T, N, dtype=dtype)
    workspace = ok.SplitKWorkspace(16, N, DEVICE)
    for extra in ({}, {"norm_weight": norm_weight}, {"residual": residual, "norm_weight": norm_weight}):
        ref = ok.decode_linear_reference(x, weight, **extra)
        for _ in range(REPEATS):
            out = run_kernel("decode_linear", ok.decode_linear, x, weight, workspace, config=config, **extra)
            for got, want in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
                assert_close("decode_linear", got, want)
    assert workspace.is_clean()


# wider than the split-K finish holds (MAX_OUT): the direct store only (CUDA: the thinker's lm_head, 152064 x 2048)
WIDE_LINEAR = (2048, 152064, LinearConfig(128, 128, 1, 8, 4)) if CUDA else (32, 16448, LinearConfig(1024, 32, 1))


@needs_triton
@pytest.mark.parametrize("rows", [1, 3])
def test_decode_linear_direct_store_wider_than_the_finish(rows):
    """An lm_head-wide linear through the direct store (no workspace, no finish) equals the reference (bf16); a K
    split or the norm at that width is refused."""
    K, N, config = WIDE_LINEAR
    x, weight = randn(rows, K), randn(N, K, scale=K ** -0.5)
    assert N > ok.linear_decode.MAX_OUT
    out = run_kernel("decode_linear", ok.decode_linear, x, weight, config=config)
    assert out.shape == (rows, N)
    assert_close("decode_linear", out, ok.decode_linear_reference(x, weight))
    with pytest.raises(ValueError, match="direct store"):
        ok.decode_linear(x, weight, config=LinearConfig(config.BLOCK_N, 16, 2))   # two K slices
    with pytest.raises(ValueError, match="direct store"):
        ok.decode_linear(x, weight, norm_weight=randn(N), config=config)


# finish tiles: rows per tile from the fp32 elements the last program holds (`splitk.finish_rows`); 0 = row by row
@needs_triton
@pytest.mark.parametrize("finish_tile", [0, 64, 4096])
@pytest.mark.parametrize("rows", [5, 16])
def test_decode_linear_finish_tiles(monkeypatch, finish_tile, rows):
    """The split-K finish (residual add + norm) gives the reference's rows whether it takes them one at a time, in
    tiles of a few rows with a masked tail, or all at once; the workspace is left zeroed."""
    K, N = (3072, 1024) if CUDA else (64, 32)   # the code predictor's down_proj
    config = LinearConfig(64, 128, 8, 4, 3) if CUDA else LinearConfig(16, 32, 2)
    monkeypatch.setattr(ok.splitk, "FINISH_TILE", finish_tile)
    x, weight = randn(rows, K), randn(N, K, scale=K ** -0.5)
    norm_weight, residual = randn(N), randn(rows, N)
    workspace = ok.SplitKWorkspace(16, N, DEVICE)
    ref = ok.decode_linear_reference(x, weight, residual, norm_weight)
    for _ in range(REPEATS):
        out = run_kernel("decode_linear", ok.decode_linear, x, weight, workspace, residual, norm_weight, config=config)
        for got, want in zip(out, ref):
            assert_close("decode_linear", got, want)
    assert workspace.is_clean()


# ---------------------------------------------------------------- greedy_embedding

# (rows, vocab, table rows, hidden): CUDA the code predictor's heads (2048 codes, 1024 wide) at 1 and 16 rows
PICK_CASES = [(1, 2048, 2048, 1024), (16, 2048, 2048, 1024), (5, 3000, 3072, 2500)] if CUDA else \
    [(1, 64, 64, 32), (6, 300, 320, 70), (3, 50, 50, 1100)]


@needs_triton
@pytest.mark.parametrize("case", PICK_CASES, ids=lambda c: f"B{c[0]}-V{c[1]}-H{c[3]}")
@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_greedy_embedding_equals_argmax_and_embedding(case, dtype):
    """Codes and rows equal `argmax` + `F.embedding` exactly: ties to the lowest id (a row of one value, repeated
    maxima), the first NaN as the largest, -inf entries, a vocab and a width that are not powers of two, a width over
    one tile."""
    B, V, N, H = case
    logits, table = randn(B, V, dtype=dtype), randn(N, H, dtype=dtype)
    logits[0, V // 3] = logits[0, V // 2] = logits[0].max() + 1   # two maxima: the first wins
    if B > 2:
        logits[1] = 0.25                                          # all tied: id 0
        logits[2, 5], logits[2, 9], logits[2, 1] = float("nan"), float("nan"), float("inf")   # the first NaN: 5
    codes, rows = run_kernel("greedy_embedding", ok.greedy_embedding, logits, table)
    want = logits.argmax(-1)
    assert torch.equal(codes, want) and codes.dtype == torch.long
    assert torch.equal(rows, F.embedding(want, table))
    ref_codes, ref_rows = ok.greedy_embedding_reference(logits, table)
    assert torch.equal(codes, ref_codes) and torch.equal(rows, ref_rows)


def test_greedy_embedding_rejects_bad_shapes():
    with pytest.raises(ValueError, match="greedy_embedding"):
        ok.greedy_embedding(torch.randn(2, 8, device=DEVICE), torch.randn(7, 4, device=DEVICE))   # fewer rows than V
    with pytest.raises(ValueError, match="greedy_embedding"):
        ok.greedy_embedding(torch.randn(8, device=DEVICE), torch.randn(8, 4, device=DEVICE))


def test_decode_linear_rejects_bad_inputs():
    x, weight = torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="decode_linear"):
        ok.decode_linear(torch.randn(17, 8, device=DEVICE), weight)   # more rows than one tile
    with pytest.raises(ValueError, match="decode_linear"):
        ok.decode_linear(x, weight[:, :6])   # in features differ
    with pytest.raises(ValueError, match="norm_weight"):
        ok.decode_linear(x, weight, residual=torch.randn(2, 4, device=DEVICE))   # a residual without the norm
    with pytest.raises(ValueError, match="residual"):
        ok.decode_linear(x, weight, residual=torch.randn(2, 5, device=DEVICE), norm_weight=torch.ones(4, device=DEVICE))


# ---------------------------------------------------------------- a decode layer's chain, PDL

def layer_chain(x, residual, p, cache, written, columns):
    """One decoder layer at decode sizes as the engine runs it with the step fusions: q/k/v (decode_linear,
    direct store), decode_attention, o_proj + residual + norm, the router, the one-launch MoE + residual + the
    next norm. Returns (normed, summed) of the last launch."""
    B, D = x.shape[0], 128
    qkv = ok.decode_linear(x, p["qkv"], config=LinearConfig(32, 128, 1, 4, 3))
    q, k, v = (t.view(B, -1, D) for t in qkv.split([p["hq"] * D, p["hk"] * D, p["hk"] * D], -1))
    attn = ok.decode_attention(q, k, v, p["qn"], p["kn"], 1e-6, p["cos"], p["sin"], *cache, written, columns,
                               D ** -0.5)
    h, summed = ok.decode_linear(attn.reshape(B, -1), p["o"], p["ws_o"], residual, p["n1"], 1e-6)
    logits = ok.decode_linear(h, p["router"], p["ws_r"])
    return ok.fused_moe(h, logits, p["w13"], p["w2"], p["top_k"], workspace=p["ws_moe"], residual=summed,
                        norm_weight=p["n2"])


@pytest.mark.skipif(not CUDA, reason="programmatic dependent launch needs a CUDA GPU (sm_90)")
def test_decode_layer_chain_in_a_graph():
    """Two decode layers' kernel chain (10 launches) captured in one CUDA graph with PDL equals the same chain
    launched plainly (eager, PDL off) and the references, replayed 20 times on fresh inputs: a kernel that read its
    input before the one before it had finished would see stale values. Every expert is used (top_k = E): with a
    real top-k choice a last-bit difference of a router logit can swap a near-tied expert (H200 run 14)."""
    H, HQ, HK, D, E, I, top_k, L = 1024, 16, 2, 128, 8, 384, 8, 256
    p = {"hq": HQ, "hk": HK, "top_k": top_k, "qkv": randn((HQ + 2 * HK) * D, H, scale=H ** -0.5),
         "qn": randn(D), "kn": randn(D), "o": randn(H, HQ * D, scale=(HQ * D) ** -0.5), "n1": randn(H),
         "router": randn(E, H, scale=H ** -0.5), "w13": randn(E, 2 * I, H, scale=H ** -0.5),
         "w2": randn(E, H, I, scale=I ** -0.5), "n2": randn(H),
         "ws_o": ok.SplitKWorkspace(1, H, DEVICE), "ws_r": ok.SplitKWorkspace(1, E, DEVICE),
         "ws_moe": ok.SplitKWorkspace(1, H, DEVICE)}
    angles = torch.rand(1, D // 2, device=DEVICE) * 100
    p["cos"], p["sin"] = angles.cos().to(BF16), angles.sin().to(BF16)
    written, columns = torch.tensor([100], device=DEVICE), 128
    x, residual = torch.empty(1, H, dtype=BF16, device=DEVICE), torch.empty(1, H, dtype=BF16, device=DEVICE)
    caches = [(randn(1, HK, L, D), randn(1, HK, L, D)) for _ in range(2)]

    def two_layers():
        h, r = layer_chain(x, residual, p, caches[0], written, columns)
        return layer_chain(h, r, p, caches[1], written, columns)

    def fresh_inputs():
        x.copy_(randn(1, H))
        residual.copy_(randn(1, H))

    was = ok.pdl()
    try:
        ok.set_pdl(True)
        fresh_inputs()
        two_layers()   # compile
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graphed = two_layers()
        for _ in range(20):
            fresh_inputs()
            graph.replay()
            out = [t.clone() for t in graphed]
            ok.set_pdl(False)
            plain = two_layers()
            ok.set_enabled(False)
            ref = two_layers()
            ok.set_enabled(True)
            ok.set_pdl(True)
            for got, eager, want in zip(out, plain, ref):
                assert torch.isfinite(got).all()
                assert ((got.double() - eager.double()).norm() / eager.double().norm()).item() <= 1e-2   # atomics' order
                assert ((got.double() - want.double()).norm() / want.double().norm()).item() <= 3e-2   # 2 layers of bf16
    finally:
        ok.set_pdl(was)
    assert all(ws.is_clean() for ws in (p["ws_o"], p["ws_r"], p["ws_moe"]))


def test_pdl_switch():
    """set_pdl / pdl switch programmatic dependent launch, set_prefetch / prefetch the L2 prefetches (all, or one
    kernel's); they never apply to CPU tensors or the interpreter, and interpreted kernels give the same results
    either way."""
    was = ok.pdl(), ok.prefetch()
    try:
        ok.set_pdl(False)
        assert not ok.pdl() and not backend.pdl_for(torch.device("cpu"), 1)
        ok.set_pdl(True)
        assert ok.pdl() and not backend.pdl_for(torch.device("cpu"), 1)
        ok.set_prefetch("decode_linear")   # one kernel's prefetch only
        assert ok.prefetch() and ok.prefetch("decode_linear") and not ok.prefetch("fused_moe")
        with pytest.raises(ValueError, match="set_prefetch"):
            ok.set_prefetch("rms_norm")
        ok.set_prefetch(True)
        assert ok.prefetch("decode_linear") and ok.prefetch("fused_moe")
        if backend.INTERPRETED:
            assert not backend.pdl_for(torch.device("cuda", 0), 1)
        elif CUDA:
            assert backend.pdl_for(torch.device(DEVICE), 1) == (torch.cuda.get_device_capability() >= (9, 0))
            assert not backend.pdl_for(torch.device(DEVICE), backend.PDL_MAX_ROWS + 1)
        x, weight = randn(2, 80), randn(48, 80, scale=80 ** -0.5)
        config = LinearConfig(16, 32, 1)
        on = run_kernel("decode_linear", ok.decode_linear, x, weight, config=config)
        ok.set_pdl(False)
        ok.set_prefetch(False)
        off = run_kernel("decode_linear", ok.decode_linear, x, weight, config=config)
        assert torch.equal(on, off)   # the direct-store path has no atomics: bit-stable
    finally:
        ok.set_pdl(was[0])
        ok.set_prefetch(was[1])


def test_pdl_environment_default():
    """OMNI_KERNELS_PDL=0 turns it off, OMNI_KERNELS_PREFETCH=1 the prefetch on, at import; defaults on / off."""
    import os
    import subprocess
    import sys

    def switches(**env):
        base = {k: v for k, v in os.environ.items() if k not in ("OMNI_KERNELS_PDL", "OMNI_KERNELS_PREFETCH")}
        code = "import omni_kernels as ok; print(ok.pdl(), ok.prefetch())"
        return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                              check=True).stdout.split()
    assert switches(OMNI_KERNELS_PDL="0", OMNI_KERNELS_PREFETCH="1") == ["False", "True"]
    assert switches() == ["True", "False"]


# ---------------------------------------------------------------- dispatch

def test_disabled_kernels_run_the_reference():
    x = torch.randn(3, 64, device=DEVICE)
    w = torch.randn(64, device=DEVICE)
    ok.set_enabled(False)
    assert not ok.enabled()
    assert torch.equal(ok.rms_norm(x, w, 1e-6), ok.rms_norm_reference(x, w, 1e-6))
    assert ok.last_backend("rms_norm") == "reference"


@pytest.mark.skipif(CUDA, reason="CPU dispatch")
def test_cpu_tensors_use_the_reference_unless_interpreting(monkeypatch):
    monkeypatch.delenv("OMNI_KERNELS_INTERPRET")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ok.silu_and_mul(torch.randn(2, 8))
    assert ok.last_backend("silu_and_mul") == "reference"


# ---------------------------------------------------------------- references against transformers (CPU)

@pytest.fixture
def qwen3_omni():
    return pytest.importorskip("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe")


def text_config(kind: str):
    from transformers.models.qwen3_omni_moe import configuration_qwen3_omni_moe as cfg

    common = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=16,
                  rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                      "mrope_section": [6, 5, 5], "interleaved": True})
    if kind == "thinker":
        config = cfg.Qwen3OmniMoeTextConfig(moe_intermediate_size=32, num_experts_per_tok=8, norm_topk_prob=True,
                                            **common)
    else:
        config = cfg.Qwen3OmniMoeTalkerTextConfig(moe_intermediate_size=24, shared_expert_intermediate_size=48,
                                                  num_experts_per_tok=6, norm_topk_prob=True, **common)
    config._experts_implementation = "eager"
    return config


def randomize(module: torch.nn.Module, dtype):
    """transformers leaves expert weights uninitialised and routers zero: fill every parameter."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5)
    return module.to(dtype)


@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_rms_norm_reference_equals_transformers(qwen3_omni, dtype):
    norm = randomize(qwen3_omni.Qwen3OmniMoeThinkerTextRMSNorm(64, eps=1e-6), dtype)
    x, r = torch.randn(5, 64).to(dtype) * 3, torch.randn(5, 64).to(dtype)
    with torch.no_grad():
        assert torch.equal(ok.rms_norm_reference(x, norm.weight, 1e-6), norm(x))
        out, summed = ok.rms_norm_reference(x, norm.weight, 1e-6, residual=r)
        assert torch.equal(summed, r + x) and torch.equal(out, norm(r + x))


@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_silu_and_mul_reference_equals_transformers_mlp(qwen3_omni, dtype):
    mlp = randomize(qwen3_omni.Qwen3OmniMoeTalkerTextMLP(text_config("talker"), intermediate_size=48), dtype)
    x = torch.randn(4, 64).to(dtype)
    with torch.no_grad():
        gate_up = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=-1)
        ref, hf = mlp.down_proj(ok.silu_and_mul_reference(gate_up)), mlp(x)
    if dtype == BF16:
        assert torch.equal(ref, hf)
    else:  # torch's vectorised and scalar fp32 exp (contiguous vs sliced gate) differ in the last bit
        torch.testing.assert_close(ref, hf, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_mrope_reference_equals_transformers_interleaved(qwen3_omni, dtype):
    config = text_config("thinker")
    rope = qwen3_omni.Qwen3OmniMoeThinkerTextRotaryEmbedding(config)
    T = 9
    q, k = torch.randn(1, 4, T, 32).to(dtype), torch.randn(1, 2, T, 32).to(dtype)
    positions = torch.stack([torch.arange(T), torch.arange(T) // 2 + 3, torch.arange(T) % 4 + 5])
    cos_hf, sin_hf = rope(q, positions[:, None, :])
    q_hf, k_hf = qwen3_omni.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos, sin = ok.rotary_cos_sin(positions, rope.inv_freq)
    q_ref, k_ref = ok.apply_mrope_reference(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin, (6, 5, 5), True)
    assert torch.equal(q_ref, q_hf[0].transpose(0, 1)) and torch.equal(k_ref, k_hf[0].transpose(0, 1))


def test_mrope_reference_equals_transformers_contiguous_sections():
    modeling_qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from transformers.models.qwen2_vl import configuration_qwen2_vl

    config = configuration_qwen2_vl.Qwen2VLTextConfig(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 6, 6]})
    rope = modeling_qwen2_vl.Qwen2VLRotaryEmbedding(config)
    T = 6
    q, k = torch.randn(1, 4, T, 32).to(BF16), torch.randn(1, 2, T, 32).to(BF16)
    positions = torch.stack([torch.arange(T), torch.arange(T) + 2, torch.arange(T) * 3])
    cos_hf, sin_hf = rope(q, positions[:, None, :])
    q_hf, k_hf = modeling_qwen2_vl.apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos, sin = ok.rotary_cos_sin(positions, rope.inv_freq)
    q_ref, k_ref = ok.apply_mrope_reference(q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin, (4, 6, 6), False)
    assert torch.equal(q_ref, q_hf[0].transpose(0, 1)) and torch.equal(k_ref, k_hf[0].transpose(0, 1))


@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind,top_k", [("thinker", 8), ("talker", 6)])
def test_fused_moe_reference_equals_transformers_block(qwen3_omni, kind, top_k, dtype):
    """The sparse MoE block's output; the talker's adds its sigmoid-gated shared expert to the routed
    experts (the kernel's part)."""
    block_class = qwen3_omni.Qwen3OmniMoeThinkerTextSparseMoeBlock if kind == "thinker" else \
        qwen3_omni.Qwen3OmniMoeTalkerTextSparseMoeBlock
    block = randomize(block_class(text_config(kind)), dtype)
    x = torch.randn(1, 11, 64).to(dtype)
    with torch.no_grad():
        logits = F.linear(x[0], block.gate.weight)
        ref = ok.fused_moe_reference(x[0], logits, block.experts.gate_up_proj, block.experts.down_proj, top_k)
        if kind == "talker":
            ref = ref + torch.sigmoid(block.shared_expert_gate(x[0])) * block.shared_expert(x[0])
        assert torch.equal(ref, block(x)[0])


@pytest.mark.parametrize("dtype", [BF16, FP32], ids=["bf16", "fp32"])
def test_decode_attention_reference_equals_transformers_attention(qwen3_omni, dtype):
    """One decode token through the thinker's attention module (q/k norms, RoPE at a text position,
    grouped-query attention over the cached prompt) equals the reference over a static cache holding
    the module's own cached keys/values (bf16: up to the attention's summation order, as torch's SDPA
    kernels for repeated and grouped heads differ)."""
    from transformers.cache_utils import DynamicCache

    cache_layers = pytest.importorskip("omni_backends.engine.kv_batch").cache_layers   # the project installed
    cache_kwargs = pytest.importorskip("omni_backends.engine.runner").cache_kwargs

    config = text_config("thinker")
    config._attn_implementation = "sdpa"
    attn = randomize(qwen3_omni.Qwen3OmniMoeThinkerTextAttention(config, layer_idx=0), dtype).eval()
    rope = qwen3_omni.Qwen3OmniMoeThinkerTextRotaryEmbedding(config)
    P, D = 7, 32
    x = torch.randn(1, P + 1, 64).to(dtype)
    positions = torch.arange(P + 1)[None, None, :].expand(3, 1, P + 1)
    cos, sin = rope(x, positions)
    cache = DynamicCache()   # one layer, filled by the module (layer_idx 0)
    with torch.no_grad():
        attn(x[:, :P], (cos[:, :P], sin[:, :P]), None, **cache_kwargs(attn, cache))
        hf, _ = attn(x[:, P:], (cos[:, P:], sin[:, P:]), None, **cache_kwargs(attn, cache))
        keys = torch.zeros(1, 2, 16, D, dtype=dtype)
        values = torch.zeros_like(keys)
        cached_k, cached_v = cache_layers(cache, length=P)[0]
        keys[:, :, :P], values[:, :, :P] = cached_k, cached_v
        h = x[0, P:]
        q, k, v = attn.q_proj(h).view(1, 4, D), attn.k_proj(h).view(1, 2, D), attn.v_proj(h).view(1, 2, D)
        out = ok.decode_attention_reference(q, k, v, attn.q_norm.weight, attn.k_norm.weight, 1e-6,
                                            cos[0, P:, :D // 2], sin[0, P:, :D // 2], keys, values,
                                            torch.tensor([P]), 16, attn.scaling)
        ref = attn.o_proj(out.reshape(1, 4 * D))
    if dtype == FP32:
        torch.testing.assert_close(ref, hf[0], rtol=1e-5, atol=1e-6)
    else:
        assert ((ref.double() - hf[0].double()).norm() / hf[0].double().norm()).item() < 1e-2
