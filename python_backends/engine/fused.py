"""Where the static-cache decoders call the `omni_kernels` Triton kernels instead of transformers modules.

Each function takes the transformers module whose weights it uses and the activations. On CUDA
tensors, with `omni_kernels` enabled (`omni_kernels.set_enabled`, the deploy option `kernels`), it
calls the fused kernel (RMSNorm with the residual add, plain RoPE of q and k in one launch, the whole
decode attention — q/k norms, RoPE, cache write, grouped-query attention — in one launch, the fused MoE,
SiLU-and-mul after one gate+up GEMM); otherwise it calls the module itself, so the CPU path is
transformers' own arithmetic (and the static engine's tokens equal the library's).

Decode-step fusions (`set_step_fusion`, on by default): at decode sizes the residual add and RMSNorm after
o_proj, after a dense MLP's down_proj (<= LINEAR_ROWS rows) and after a sparse MoE block (the next layer's input
norm; <= DECODE_ROWS rows) run inside the launch that produces their input (`omni_kernels.decode_linear`,
`fused_moe` with a norm epilogue; the MoE itself one launch at the fewest tokens), and the linears that the
tuning table marks faster (the routers; q/k/v, gate/up and the lm_head where its direct-store tiles beat torch) run as
`decode_linear` (`set_direct_decode_linear(False)` keeps torch's linear for the direct-store ones). The decode kernels
are launched with programmatic dependent launch on sm_90 (`omni_kernels.set_pdl`), so inside a step's CUDA graph
each launch overlaps the tail of the one before. Those kernels keep a zeroed split-K
workspace per module (`WORKSPACE`), created on first use (the graphs' eager warm-up) and never replaced.
"""
from __future__ import annotations

import torch

try:
    import omni_kernels
except ImportError:  # pragma: no cover - the package is part of this repository
    omni_kernels = None

_KERNELS = ("rms_norm", "fused_moe", "silu_and_mul", "apply_mrope", "decode_attention", "decode_linear",
            "greedy_embedding", "SplitKWorkspace", "enabled")
FUSED = "omni_fused_weight"   # attribute holding the concatenated weight of fused projections
WORKSPACE = "omni_splitk_workspace"   # attribute holding a module's split-K workspace (decode-step fusions)
DECODE_ROWS = 16   # rows up to which the MoE norm epilogue runs (decode_linear's limit; the workspaces' rows)
LINEAR_ROWS = 4    # rows up to which decode_linear replaces torch's linear (run 30: faster at 1 and 4 rows, slower at 16)


def available() -> bool:
    """True when `omni_kernels` provides the kernels used here."""
    return omni_kernels is not None and all(hasattr(omni_kernels, name) for name in _KERNELS)


def active(x: torch.Tensor) -> bool:
    """True when `x` is a CUDA tensor and the kernels are available and enabled."""
    return x.is_cuda and available() and bool(omni_kernels.enabled())


_fused_attention = True


def set_fused_attention(flag: bool) -> None:
    """Use the one-launch decode attention (`decode_attention`) while the kernels are active (default); False
    keeps the other kernels and runs attention as norms + RoPE + cache writes + SDPA (benchmark A/B)."""
    global _fused_attention
    _fused_attention = bool(flag)


_step_fusion = True


def set_step_fusion(flag: bool) -> None:
    """Use the decode-step fusions (module doc) while the kernels are active (default); False runs the same
    kernels with separate norm launches and the grouped (four-launch) MoE (benchmark A/B)."""
    global _step_fusion
    _step_fusion = bool(flag)


_direct_decode_linear = True


def set_direct_decode_linear(flag: bool) -> None:
    """Run the plain decode linears whose tuned tile is direct-store (one K slice: q/k/v, dense gate/up where it
    beat torch, the thinker's lm_head) as `decode_linear` (default); False keeps torch's linear for them (benchmark
    A/B). The split-K ones (the routers, the norm-fused linears) are not affected."""
    global _direct_decode_linear
    _direct_decode_linear = bool(flag)


def set_linear_rows(rows: int) -> None:
    """Rows up to which `decode_linear` replaces torch's linear (default LINEAR_ROWS, measured at 1, 4 and 16 rows; at most
    DECODE_ROWS; benchmark A/B)."""
    global _linear_rows
    _linear_rows = max(0, min(int(rows), DECODE_ROWS))


_linear_rows = LINEAR_ROWS


def step_fusion_active(x: torch.Tensor, rows: int = DECODE_ROWS) -> bool:
    """True when the decode-step fusions apply to a step on rows x [T, ...] (at most `rows` of them)."""
    return _step_fusion and x.shape[0] <= rows and active(x)


def _workspace(module: torch.nn.Module, width: int, device: torch.device):
    """The module's split-K workspace [DECODE_ROWS, width] (made once: CUDA graphs keep its address)."""
    workspace = getattr(module, WORKSPACE, None)
    if workspace is None:
        workspace = omni_kernels.SplitKWorkspace(DECODE_ROWS, width, device)
        setattr(module, WORKSPACE, workspace)
    return workspace


def attention_active(x: torch.Tensor) -> bool:
    """True when a decode step on `x` should use `decode_attention`."""
    return _fused_attention and active(x)


def set_enabled(flag: bool) -> bool:
    """Turn the kernels on or off (no-op without them); returns whether they are active for CUDA tensors now."""
    if available():
        omni_kernels.set_enabled(flag)
        return bool(omni_kernels.enabled())
    return False


def rms_norm(norm: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None):
    """`norm(x)` for a transformers RMSNorm module (`weight`, `variance_epsilon`); with `residual`,
    returns `(norm(x + residual), x + residual)` (the decoder's add-then-norm)."""
    if active(x):
        return omni_kernels.rms_norm(x, norm.weight, norm.variance_epsilon, residual=residual)
    if residual is None:
        return norm(x)
    x = x + residual
    return norm(x), x


@torch.no_grad()
def fuse_linears(owner: torch.nn.Module, linears: list[torch.nn.Linear]) -> bool:
    """Concatenate the weights of bias-free linears that read the same input (q/k/v, gate/up) into one
    tensor stored as `owner.omni_fused_weight`, and make each linear's weight a view of it: one GEMM
    instead of several, no extra memory, and the modules (transformers' own prefill) keep working.
    Returns False (nothing changed) for linears with biases or different dtypes/devices."""
    if hasattr(owner, FUSED):
        return True
    weights = [linear.weight for linear in linears]
    if any(linear.bias is not None for linear in linears) or len({(w.dtype, w.device) for w in weights}) != 1:
        return False
    fused = torch.cat(weights)
    start = 0
    for linear, weight in zip(linears, weights):
        linear.weight = torch.nn.Parameter(fused[start:start + weight.shape[0]], requires_grad=False)
        start += weight.shape[0]
    setattr(owner, FUSED, fused)
    return True


def rope(q: torch.Tensor, k: torch.Tensor, cos_half: torch.Tensor, sin_half: torch.Tensor):
    """Plain (1-D) RoPE of q [B, Hq, D] and k [B, Hk, D] with per-row tables cos/sin [B, D/2] in the
    activations' dtype (transformers' rotate-half form; mRoPE with equal section positions is the same)."""
    if active(q):
        return omni_kernels.apply_mrope(q, k, cos_half, sin_half, mrope_section=None)
    cos, sin = torch.cat((cos_half, cos_half), -1)[:, None], torch.cat((sin_half, sin_half), -1)[:, None]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def decode_attention(attn: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_half: torch.Tensor,
                     sin_half: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     written: torch.Tensor, columns: int) -> torch.Tensor:
    """One decode token per row through a Qwen3 attention module's q/k norms, RoPE (per-row tables [B, D/2])
    and grouped-query attention over a static cache [slots, Hk, L, D] (row b = slot b, its new key/value
    written at column `written[b]`, columns 0..written[b] attended): `omni_kernels.decode_attention`, one
    launch. q [B, Hq, D], k/v [B, Hk, D]; returns [B, Hq, D] (before o_proj). Only called when `attention_active`."""
    return omni_kernels.decode_attention(q, k, v, attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon,
                                         cos_half, sin_half, key_cache, value_cache, written, columns, attn.scaling)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def dense_mlp(mlp: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """`down(silu(gate(h)) * up(h))` of a transformers gated MLP: one gate+up GEMM and the fused
    silu-and-mul when its projections were fused (`fuse_linears`) and the kernels are active."""
    fused = getattr(mlp, FUSED, None)
    if fused is None or not active(h):
        return mlp(h)
    return mlp.down_proj(omni_kernels.silu_and_mul(linear(mlp, h, fused)))


def _fused_moe(mlp: torch.nn.Module, h: torch.Tensor, **norm):
    """`omni_kernels.fused_moe` over a sparse block's router (`linear`) and experts, with an optional norm
    epilogue: with the step fusions the table's path (one launch at the fewest tokens) and the block's workspace,
    else the grouped path."""
    gate, experts = mlp.gate, mlp.experts
    config = None
    if not step_fusion_active(h):
        config = omni_kernels.moe_configs.moe_config(h.shape[0], h.shape[1], experts.down_proj.shape[-1],
                                                     one_launch=False)
    return omni_kernels.fused_moe(h, linear(gate, h, gate.weight), experts.gate_up_proj, experts.down_proj,
                                  gate.top_k, renormalize=gate.norm_topk_prob, config=config,
                                  workspace=_workspace(mlp, h.shape[1], h.device) if config is None else None, **norm)


def moe(mlp: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The feed-forward block of a decoder layer for tokens h [T, H] -> [T, H].

    Sparse blocks (`gate` router + `experts` with `gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I], and the
    talker's optional `shared_expert` with its sigmoid gate) run as one fused MoE when the kernels are
    active; otherwise (and for dense MLPs) the module itself runs.
    """
    experts = getattr(mlp, "experts", None)
    if experts is None:
        return dense_mlp(mlp, h)
    if not active(h):
        return mlp(h[:, None, :])[:, 0]
    routed = _fused_moe(mlp, h)
    shared = getattr(mlp, "shared_expert", None)
    if shared is not None:
        routed = routed + torch.sigmoid(mlp.shared_expert_gate(h)) * dense_mlp(shared, h)
    return routed


def _decode_linear_for(weight: torch.Tensor, x: torch.Tensor, with_norm: bool) -> bool:
    n, k = weight.shape
    if not (step_fusion_active(x, _linear_rows) and omni_kernels.linear_decode.decode_linear_faster(n, k, with_norm)):
        return False
    return with_norm or _direct_decode_linear or omni_kernels.linear_decode.linear_config(n, k).SPLIT_K > 1


def linear(owner: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, weight)` for a bias-free weight owned by `owner` (the router's `gate.weight`, the fused q/k/v
    weight of an attention module): `decode_linear` at decode sizes where the tuning table measured it faster."""
    if _decode_linear_for(weight, x, with_norm=False):
        split = omni_kernels.linear_decode.linear_config(*weight.shape).SPLIT_K > 1   # the direct store needs none
        return omni_kernels.decode_linear(x, weight, _workspace(owner, weight.shape[0], x.device) if split else None)
    return torch.nn.functional.linear(x, weight)


def greedy_embedding(logits: torch.Tensor, embedding: torch.nn.Embedding) -> tuple[torch.Tensor, torch.Tensor]:
    """`(codes, embedding(codes))` with codes = logits.argmax(-1), for logits [B, V] and a plain embedding module
    (no max_norm): one `omni_kernels.greedy_embedding` launch while the kernels are active, else the two ops.
    Returns int64 [B] and [B, H] in the table's dtype."""
    if active(logits):
        return omni_kernels.greedy_embedding(logits, embedding.weight)
    codes = logits.argmax(-1)
    return codes, embedding(codes)


def lm_head(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`head(x)` for a decoder's output projection [vocab, hidden] on x [T, hidden] -> [T, vocab] logits in x's
    dtype: `decode_linear` (direct store, a PDL launch in the step's chain) where the tuning table has a tile for the
    head's shape and measured it faster than torch's linear, else the module."""
    return head(x) if head.bias is not None else linear(head, x, head.weight)


def linear_norm(proj: torch.nn.Linear, x: torch.Tensor, norm: torch.nn.Module, residual: torch.Tensor):
    """`(norm(proj(x) + residual), proj(x) + residual)` for a bias-free linear (o_proj, down_proj) and the
    RMSNorm after the residual add: one `decode_linear` launch with the step fusions, else the linear and
    `rms_norm`."""
    if proj.bias is None and _decode_linear_for(proj.weight, x, with_norm=True):
        return omni_kernels.decode_linear(x, proj.weight, _workspace(proj, proj.out_features, x.device),
                                          residual, norm.weight, norm.variance_epsilon)
    return rms_norm(norm, proj(x), residual)


def mlp_norm(mlp: torch.nn.Module, h: torch.Tensor, norm: torch.nn.Module, residual: torch.Tensor):
    """`(norm(mlp(h) + residual), mlp(h) + residual)`: a decoder layer's feed-forward block (`moe`) followed by
    its residual add and the next RMSNorm (the next layer's input norm, or the final norm). With the step
    fusions the norm runs in the launch that ends the block: the fused MoE's epilogue (sparse blocks without a
    shared expert) or down_proj's (`linear_norm`, dense MLPs with a fused gate+up)."""
    if step_fusion_active(h):
        if getattr(mlp, "experts", None) is not None and getattr(mlp, "shared_expert", None) is None:
            return _fused_moe(mlp, h, residual=residual, norm_weight=norm.weight, eps=norm.variance_epsilon)
        fused_gate_up = getattr(mlp, FUSED, None)
        if getattr(mlp, "experts", None) is None and fused_gate_up is not None:
            inter = omni_kernels.silu_and_mul(linear(mlp, h, fused_gate_up))
            return linear_norm(mlp.down_proj, inter, norm, residual)
    return rms_norm(norm, moe(mlp, h), residual)
