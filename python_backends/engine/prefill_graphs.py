"""Whole short prompts of ONE request prefilled by replaying a CUDA graph captured per prompt-length bucket.

transformers' forward of a prompt is thousands of small kernel launches (a Qwen3-Omni thinker layer is ~100
eager ops: norms in fp32, q/k norms, mRoPE, SDPA, the router, the grouped-GEMM experts; 48 layers), so a short
prompt's prefill costs the host's launch time, not the GPU's (docs/gpu.md, run 17). `PrefillGraphs` pads the
prompt on the right to the next bucket (16, 32, 64, ... tokens), runs the model's forward over the padded
prompt with no attention mask (pure causal attention) and replays that forward from a CUDA graph per bucket.
Right padding under causal attention leaves every real position's result as an unpadded forward computes it
(a real query attends only to earlier, real keys); the padded positions' outputs and keys are dropped. The
keys/values come out of the forward's own `DynamicCache` (created inside the captured function), so the caller
copies the real columns into its static cache as after an eager prefill.

On CPU, or with graphs disabled, the same padded forward runs eagerly (`StepGraphs`' fallback).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from omni_backends.engine.graphs import StepGraphs, power_of_two_buckets
from omni_backends.engine.static_kv import LayerKV

# forward(inputs [1, W] ids or [1, W, H] embeddings) -> (logits [1, W, V], (hidden [1, W, H], ...), cache) where
# cache is the forward's DynamicCache (full-attention layers with .keys / .values [1, kv_heads, W, head_dim])
PrefillForward = Callable[[torch.Tensor], tuple[torch.Tensor, Sequence[torch.Tensor], object]]


@dataclass
class PrefillResult:
    """One prompt's prefill outputs (n = its real length).

    Fields:
        logits: [V] at the prompt's last position (the model's dtype; a copy).
        hidden: the forward's selected hidden states, each [n, H] (copies).
        layers: per layer (keys, values) [1, kv_heads, n, head_dim]: views of graph memory, valid until the next run.
    """

    logits: torch.Tensor
    hidden: list[torch.Tensor]
    layers: list[LayerKV]


class PrefillGraphs:
    """Batch-1 prefills of prompts up to `max_tokens` tokens, one CUDA graph per power-of-two length bucket.

    Args:
        forward: the model's forward over a padded prompt (`PrefillForward`); must launch device work only.
        hidden: how many hidden states `forward` returns.
        max_tokens: the largest bucket (longer prompts are not taken: `fits`). min_tokens: the smallest bucket.
        graphs: capture CUDA graphs (on CUDA inputs); False: the padded forward runs eagerly.
        name: for logs.

    Not thread-safe across callers of `run` (the engine thread that owns the model calls it).
    """

    def __init__(self, forward: PrefillForward, *, hidden: int, max_tokens: int = 256, min_tokens: int = 16,
                 graphs: bool = True, name: str = "prefill"):
        self.forward, self.hidden = forward, hidden
        self.buckets = power_of_two_buckets(max_tokens, start=min_tokens)
        self.graphs = StepGraphs(self._padded, enabled=graphs, name=name)

    def fits(self, tokens: int) -> bool:
        """True when a prompt of `tokens` tokens is taken (1..max_tokens)."""
        return 0 < tokens <= self.buckets[-1]

    def bucket(self, tokens: int) -> int:
        """The padded width of a prompt of `tokens` tokens. Raises ValueError when it does not fit."""
        if not self.fits(tokens):
            raise ValueError(f"a prompt of {tokens} tokens does not fit the prefill buckets (<= {self.buckets[-1]})")
        return next(width for width in self.buckets if width >= tokens)

    def run(self, inputs: torch.Tensor) -> PrefillResult:
        """Prefill one prompt: inputs int64 [n] token ids or float [n, H] embeddings, on the model's device.
        Raises ValueError when n does not fit."""
        n = inputs.shape[0]
        width = self.bucket(n)
        padded = inputs.new_zeros(1, width, *inputs.shape[1:])
        padded[0, :n] = inputs
        logits, *rest = self.graphs.run(width, {"inputs": padded})
        hidden, kv = rest[:self.hidden], rest[self.hidden:]
        half = len(kv) // 2
        return PrefillResult(logits=logits[0, n - 1].clone(), hidden=[h[0, :n].clone() for h in hidden],
                             layers=[(k[:, :, :n], v[:, :, :n]) for k, v in zip(kv[:half], kv[half:])])

    def warmup(self, example: torch.Tensor) -> int:
        """Capture every bucket before serving (CUDA only): `example` is one token of input (int64 [1] id or
        float [1, H]) on the model's device. Returns the graphs captured so far."""
        if example.device.type != "cuda" or not self.graphs.enabled:
            return 0
        for width in self.buckets:
            self.run(example.expand(width, *example.shape[1:]).clone())
        torch.cuda.synchronize(example.device)
        return self.graphs.stats().captured

    def _padded(self, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits, hidden, cache = self.forward(inputs)
        return (logits, *hidden, *(layer.keys for layer in cache.layers), *(layer.values for layer in cache.layers))
