"""Where the static-cache decoders call the `omni_kernels` Triton kernels instead of transformers modules.

Each function takes the transformers module whose weights it uses and the activations. On CUDA
tensors, with `omni_kernels` enabled (`omni_kernels.set_enabled`, the deploy option `kernels`), it
calls the fused kernel; otherwise it calls the module itself, so the CPU path is transformers' own
arithmetic (and the static engine's tokens equal the library's).
"""
from __future__ import annotations

import torch

try:
    import omni_kernels
except ImportError:  # pragma: no cover - the package is part of this repository
    omni_kernels = None

_KERNELS = ("rms_norm", "fused_moe", "enabled")


def available() -> bool:
    """True when `omni_kernels` provides the kernels used here."""
    return omni_kernels is not None and all(hasattr(omni_kernels, name) for name in _KERNELS)


def active(x: torch.Tensor) -> bool:
    """True when `x` is a CUDA tensor and the kernels are available and enabled."""
    return x.is_cuda and available() and bool(omni_kernels.enabled())


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


def moe(mlp: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The feed-forward block of a decoder layer for tokens h [T, H] -> [T, H].

    Sparse blocks (`gate` router + `experts` with `gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I], and the
    talker's optional `shared_expert` with its sigmoid gate) run as one fused MoE when the kernels are
    active; otherwise (and for dense MLPs) the module itself runs.
    """
    experts = getattr(mlp, "experts", None)
    if experts is None or not active(h):
        return mlp(h[:, None, :])[:, 0] if experts is not None else mlp(h)
    gate = mlp.gate
    routed = omni_kernels.fused_moe(h, torch.nn.functional.linear(h, gate.weight), experts.gate_up_proj,
                                    experts.down_proj, gate.top_k, renormalize=gate.norm_topk_prob)
    shared = getattr(mlp, "shared_expert", None)
    if shared is not None:
        routed = routed + torch.sigmoid(mlp.shared_expert_gate(h)) * shared(h)
    return routed
