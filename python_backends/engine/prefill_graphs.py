"""Whole short prompts prefilled by replaying a CUDA graph captured per (batch bucket, prompt-length bucket).

transformers' forward of a prompt is thousands of small kernel launches (a Qwen3-Omni thinker layer is ~100
eager ops: norms in fp32, q/k norms, mRoPE, SDPA, the router, the grouped-GEMM experts; 48 layers), so a short
prompt's prefill costs the host's launch time, not the GPU's (docs/gpu.md, run 17). `PrefillGraphs` pads the
prompt on the right to the next bucket (16, 32, 64, ... tokens), runs the model's forward over the padded
prompt with no attention mask (pure causal attention) and replays that forward from a CUDA graph per bucket.
Right padding under causal attention leaves every real position's result as an unpadded forward computes it
(a real query attends only to earlier, real keys); the padded positions' outputs and keys are dropped. The
keys/values come out of the forward's own `DynamicCache` (created inside the captured function), so the caller
copies the real columns into its static cache as after an eager prefill.
Prompts that arrive together (a burst: 16 requests at once) run as ONE padded batch: the rows padded to the
longest prompt's bucket, the batch to a power of two (zero rows), up to `max_batch` rows and `batch_tokens`
padded tokens (rows are independent: no attention between rows, routing per token). Each graph keeps only the
logits of each row's last real position (gathered inside the graph), not [rows, width, vocab].

On CPU, or with graphs disabled, the same padded forward runs eagerly (`StepGraphs`' fallback).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from omni_backends.engine.graphs import StepGraphs, batch_bucket, power_of_two_buckets
from omni_backends.engine.static_kv import LayerKV

# forward(inputs [B, W] ids or [B, W, H] embeddings) -> (logits [B, W, V], (hidden [B, W, H], ...), cache) where
# cache is the forward's DynamicCache (full-attention layers with .keys / .values [B, kv_heads, W, head_dim])
PrefillForward = Callable[[torch.Tensor], tuple[torch.Tensor, Sequence[torch.Tensor], object]]
MAX_BATCH = 16        # prompts per padded forward (a c=16 burst in one)
BATCH_TOKENS = 1024   # padded tokens per forward of several prompts: 16 prompts of <= 64 tokens


@dataclass
class PrefillResult:
    """One prompt's prefill outputs (n = its real length; its keys/values are its row of `PrefillBatch.layers`).

    Fields:
        logits: [V] at the prompt's last position (the model's dtype; a copy).
        hidden: the forward's selected hidden states, each [n, H] (copies).
    """

    logits: torch.Tensor
    hidden: list[torch.Tensor]


@dataclass
class PrefillBatch:
    """The prompts of one padded forward (`PrefillGraphs.run_batch`).

    Fields:
        rows: each prompt's `PrefillResult`, in order.
        layers: per layer (keys, values) [prompts, kv_heads, W, head_dim] of all prompts at once (W: the padded
            width; columns past a prompt's length are padding): views of graph memory, valid until the next run.
    """

    rows: list[PrefillResult]
    layers: list[LayerKV]


class PrefillGraphs:
    """Prefills of prompts up to `max_tokens` tokens, alone or several together, one CUDA graph per (batch bucket,
    power-of-two length bucket).

    Args:
        forward: the model's forward over padded prompts (`PrefillForward`); must launch device work only.
        hidden: how many hidden states `forward` returns.
        max_tokens: the largest length bucket (longer prompts are not taken: `fits`). min_tokens: the smallest.
        max_batch: most prompts in one padded forward (batch buckets 1, 2, 4, ..., max_batch).
        batch_tokens: most padded tokens (batch bucket x length bucket) of a forward of several prompts (a lone
            prompt may use any length bucket).
        graphs: capture CUDA graphs (on CUDA inputs); False: the padded forward runs eagerly.
        name: for logs.

    Not thread-safe across callers of `run` (the engine thread that owns the model calls it).
    """

    def __init__(self, forward: PrefillForward, *, hidden: int, max_tokens: int = 256, min_tokens: int = 16,
                 max_batch: int = MAX_BATCH, batch_tokens: int = BATCH_TOKENS, graphs: bool = True,
                 name: str = "prefill"):
        self.forward, self.hidden = forward, hidden
        self.buckets = power_of_two_buckets(max_tokens, start=min_tokens)
        self.batches = power_of_two_buckets(max_batch)
        self.batch_tokens = batch_tokens
        self.graphs = StepGraphs(self._padded, enabled=graphs, name=name)

    def fits(self, tokens: int) -> bool:
        """True when a prompt of `tokens` tokens is taken alone (1..max_tokens)."""
        return 0 < tokens <= self.buckets[-1]

    def fits_batch(self, lengths: Sequence[int]) -> bool:
        """True when prompts of these lengths (tokens) are taken together in one padded forward."""
        if not lengths or len(lengths) > self.batches[-1] or not all(self.fits(n) for n in lengths):
            return False
        return self._allowed(batch_bucket(len(lengths), self.batches), self.bucket(max(lengths)))

    def _allowed(self, rows: int, width: int) -> bool:
        return rows == 1 or rows * width <= self.batch_tokens

    def bucket(self, tokens: int) -> int:
        """The padded width of a prompt of `tokens` tokens. Raises ValueError when it does not fit."""
        if not self.fits(tokens):
            raise ValueError(f"a prompt of {tokens} tokens does not fit the prefill buckets (<= {self.buckets[-1]})")
        return next(width for width in self.buckets if width >= tokens)

    def run_batch(self, prompts: Sequence[torch.Tensor]) -> PrefillBatch:
        """Prefill prompts together in one padded forward (each int64 [n] token ids or float [n, H] embeddings on the
        model's device, one dtype; a lone prompt is a batch of one), in order; the layers are views of this forward's
        memory (copy them before the next run). Raises ValueError when they do not fit together (`fits_batch`)."""
        lengths = [p.shape[0] for p in prompts]
        if not self.fits_batch(lengths):
            raise ValueError(f"prompts of {lengths} tokens do not fit one prefill forward (<= {self.batches[-1]} of "
                             f"<= {self.buckets[-1]} tokens, <= {self.batch_tokens} padded tokens)")
        first = prompts[0]
        rows, width = batch_bucket(len(prompts), self.batches), self.bucket(max(lengths))
        padded = first.new_zeros(rows, width, *first.shape[1:])
        for row, prompt in enumerate(prompts):
            padded[row, :lengths[row]] = prompt
        last = torch.tensor([n - 1 for n in lengths] + [0] * (rows - len(prompts))).to(first.device, non_blocking=True)
        logits, *rest = self.graphs.run((rows, width), {"inputs": padded, "last": last})
        hidden, kv = rest[:self.hidden], rest[self.hidden:]
        half = len(kv) // 2
        keys, values, count = kv[:half], kv[half:], len(prompts)
        rows = [PrefillResult(logits=logits[row].clone(), hidden=[h[row, :n].clone() for h in hidden])
                for row, n in enumerate(lengths)]
        return PrefillBatch(rows, [(k[:count], v[:count]) for k, v in zip(keys, values)])

    def warmup(self, example: torch.Tensor) -> int:
        """Capture every (batch, length) bucket before serving (CUDA only): `example` is one token of input (int64
        [1] id or float [1, H]) on the model's device. Returns the graphs captured so far."""
        if example.device.type != "cuda" or not self.graphs.enabled:
            return 0
        for rows in self.batches:
            for width in self.buckets:
                if self._allowed(rows, width):
                    self.run_batch([example.expand(width, *example.shape[1:]).clone()] * rows)
        torch.cuda.synchronize(example.device)
        return self.graphs.stats().captured

    def _padded(self, inputs: torch.Tensor, last: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The captured function: the forward over inputs [B, W(, H)], then each row's logits at its `last` position
        (int64 [B]): (logits [B, V], hidden [B, W, H] each, keys [B, kv_heads, W, D] per layer, values ...)."""
        logits, hidden, cache = self.forward(inputs)
        logits = logits[torch.arange(logits.shape[0], device=logits.device), last]
        return (logits, *hidden, *(layer.keys for layer in cache.layers), *(layer.values for layer in cache.layers))
