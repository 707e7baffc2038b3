"""omni_kernels: Triton-language GPU kernels, each with a PyTorch reference and a CPU fallback.

Ops (each dispatches per call, see `backend`): compiled Triton for CUDA tensors while enabled; Triton's
interpreter for CPU tensors under `OMNI_KERNELS_INTERPRET=1`; otherwise the op's PyTorch reference.
  rms_norm(x, weight, eps, residual=None)        -> out | (out, x + residual)
  silu_and_mul(x)                                -> silu(x[..., :d]) * x[..., d:]
  apply_mrope(q, k, cos, sin, mrope_section, interleaved) -> (q, k)
  fused_moe(hidden, router_logits, w13, w2, top_k, renormalize=True, config=None, workspace=None,
            residual=None, norm_weight=None, eps=1e-6) -> [T, H] | rms_norm's result on it
  decode_linear(x, weight, workspace=None, residual=None, norm_weight=None, eps=1e-6) -> [T, N] | rms_norm's
                                                 result on it (T <= 16 rows; one launch)
  SplitKWorkspace(max_rows, width, device): the zeroed fp32 accumulator of the decode-sized split-K kernels
  greedy_embedding(logits, table)                -> (logits.argmax(-1), table rows of those ids)   (one launch)
  decode_attention(q, k, v, q_weight, k_weight, eps, cos, sin, key_cache, value_cache, written, columns,
                   scale) -> [B, Hq, D]   (q/k norm + RoPE + cache write + grouped-query attention)
Switch: `set_enabled(flag)` / `enabled()`; `last_backend(op)` names the backend of the last call.
Programmatic dependent launch of the decode kernels: `set_pdl(flag)` / `pdl()` (env `OMNI_KERNELS_PDL=0`: off);
their L2 weight prefetch: `set_prefetch(flag or kernel name)` / `prefetch(kernel=None)` (off by default).
See docs/kernels.md.
"""
from .activation import silu_and_mul, silu_and_mul_reference
from .attention import decode_attention, decode_attention_reference
from .backend import HAVE_TRITON, enabled, last_backend, pdl, prefetch, set_enabled, set_pdl, set_prefetch
from .linear_decode import decode_linear, decode_linear_reference
from .moe import fused_moe, fused_moe_reference
from .moe_routing import moe_topk_reference
from .norm import rms_norm, rms_norm_reference
from .pick import greedy_embedding, greedy_embedding_reference
from .rotary import apply_mrope, apply_mrope_reference, rotary_cos_sin
from .splitk import SplitKWorkspace

__all__ = [
    "HAVE_TRITON", "SplitKWorkspace", "apply_mrope", "apply_mrope_reference", "decode_attention",
    "decode_attention_reference", "decode_linear", "decode_linear_reference", "enabled", "fused_moe",
    "fused_moe_reference", "greedy_embedding", "greedy_embedding_reference", "last_backend", "moe_topk_reference", "pdl", "prefetch", "rms_norm", "rms_norm_reference",
    "rotary_cos_sin", "set_enabled", "set_pdl", "set_prefetch", "silu_and_mul", "silu_and_mul_reference",
]
