"""Per-request sampling parameters and next-token selection for one row of logits.

The engine loop calls `sample_next_token` once per live request and step, on that request's row of
the batch logits, so every request keeps its own parameters and its own random generator.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from omni_backends.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    Fields:
        max_tokens: int >= 1, the most tokens to generate (finish_reason "length" when reached).
        temperature: float >= 0; 0 means greedy.
        top_p: float in (0, 1]; nucleus sampling keeps the smallest set of tokens whose probability
            sums to at least top_p (1 disables it).
        top_k: int >= 0; keep the k most likely tokens (0 disables it).
        do_sample: False forces greedy decoding whatever the temperature.
        seed: int or None; seeds this request's own torch.Generator, so a seeded request draws the same
            tokens whatever else is in the batch. None draws from torch's global generator.
        stop_token_ids: token ids that end the request (finish_reason "stop"); the stop token itself is
            part of the output, as in `model.generate`.
        min_tokens: int >= 0; stop tokens are masked out until this many tokens exist.
        repetition_penalty: float > 0 (1 disables it); HF semantics: logits of tokens already seen in
            the prompt or output are divided by it when positive and multiplied by it when negative.
        suppress_token_ids: token ids that are never produced (their logits are set to -inf).

    Raises:
        ValueError: on any out-of-range value, with the field name in the message.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    do_sample: bool = True
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    suppress_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "suppress_token_ids", tuple(int(t) for t in self.suppress_token_ids))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None and not -2**63 <= self.seed < 2**63:
            raise ValueError(f"seed must be a 64-bit signed integer, got {self.seed}")
        if any(t < 0 for t in self.stop_token_ids + self.suppress_token_ids):
            raise ValueError("stop_token_ids and suppress_token_ids must be non-negative token ids")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0 or do_sample False)."""
        return not self.do_sample or self.temperature == 0

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "SamplingParams":
        """Build from a JSON-like mapping (e.g. a request's `sampling_parameters`).

        Raises:
            ValueError: on an unknown key or an invalid value.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}; known: {sorted(known)}")
        kwargs = dict(values)
        for key in ("stop_token_ids", "suppress_token_ids"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A torch.Generator seeded with `seed` on `device`, or None (use the global RNG) when seed is None."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def sample_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    seen_token_ids: torch.Tensor | None = None,
    num_generated: int = 0,
    generator: torch.Generator | None = None,
) -> int:
    """Pick the next token of one request.

    Args:
        logits: float [vocab], the request's next-token logits (not modified).
        params: the request's SamplingParams.
        seen_token_ids: int64 [n] prompt + generated ids, for repetition_penalty (ignored when it is 1).
        num_generated: tokens generated so far, for min_tokens.
        generator: the request's generator from `make_generator` (None: global RNG).

    Returns:
        The chosen token id.
    """
    scores = masked_scores(logits.float().clone(), params, seen_token_ids, num_generated)
    if params.greedy:
        return int(scores.argmax())
    scores = scores / params.temperature
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - params.top_p
        remove[-1] = False  # always keep the most likely token
        scores = scores.masked_fill(remove.scatter(0, order, remove), -float("inf"))
    probs = scores.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def masked_scores(scores: torch.Tensor, params: SamplingParams, seen_token_ids: torch.Tensor | None = None,
                  num_generated: int = 0) -> torch.Tensor:
    """Apply repetition_penalty, suppress_token_ids and min_tokens to one row of float scores [vocab], in place
    (returns it). Only device operations: no host synchronisation on CUDA tensors."""
    _mask_rows(scores[None], [params], [seen_token_ids], [num_generated])
    return scores


@functools.lru_cache(maxsize=64)
def _token_index(token_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """int64 [n] of `token_ids` on `device`, made once per (set, device): a suppress list of 1,023 codec ids
    would otherwise be turned into a tensor and copied to the device for every row of every step."""
    return torch.tensor(token_ids, dtype=torch.long, device=device)


def _mask_rows(scores: torch.Tensor, params: Sequence[SamplingParams], seen_token_ids: Sequence[torch.Tensor | None],
               num_generated: Sequence[int]) -> None:
    """`masked_scores` for every row of scores [B, vocab], in place: the repetition penalty per row, then one
    indexed write of -inf per distinct suppress set and per distinct stop set (rows sharing a set are masked
    together). Same values as masking row by row (the -inf writes commute with each other and follow the
    penalty in both)."""
    for row, (p, seen) in enumerate(zip(params, seen_token_ids)):
        if p.repetition_penalty != 1.0 and seen is not None and seen.numel():
            seen = seen.to(scores.device)
            picked = scores[row, seen]
            scores[row, seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
    groups: dict[tuple[int, ...], set[int]] = {}
    for row, (p, n) in enumerate(zip(params, num_generated)):
        if p.suppress_token_ids:
            groups.setdefault(p.suppress_token_ids, set()).add(row)
        if n < p.min_tokens and p.stop_token_ids:
            groups.setdefault(p.stop_token_ids, set()).add(row)
    for token_ids, rows in groups.items():
        index = _token_index(token_ids, scores.device)
        if len(rows) == scores.shape[0]:
            scores[:, index] = -float("inf")
        else:
            scores[torch.tensor(sorted(rows), device=scores.device)[:, None], index[None]] = -float("inf")


def sample_rows(logits: torch.Tensor, params: Sequence[SamplingParams], seen_token_ids: Sequence[torch.Tensor | None],
                num_generated: Sequence[int], generators: Sequence[torch.Generator | None]) -> list[int]:
    """`sample_next_token` for every row of a batch with ONE host synchronisation for the greedy rows.

    Args:
        logits: float [B, vocab] on any device (not modified); the other arguments are per row.

    Greedy rows are masked on the logits' device and picked by one batched argmax; sampled rows run
    `sample_next_token` on the CPU with their own generator, so each row's token is exactly what
    `sample_next_token` gives for it alone.
    """
    tokens: list[int | None] = [None] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        scores = logits[greedy].float()
        _mask_rows(scores, [params[i] for i in greedy], [seen_token_ids[i] for i in greedy],
                   [num_generated[i] for i in greedy])
        for i, token in zip(greedy, scores.argmax(-1).tolist()):
            tokens[i] = token
    for i, p in enumerate(params):
        if tokens[i] is None:
            tokens[i] = sample_next_token(logits[i].cpu(), p, seen_token_ids[i], num_generated[i], generators[i])
    return tokens


def check_context_length(prompt_tokens: int, max_tokens: int, context_length: int) -> None:
    """Raises RequestError (HTTP 400, param max_tokens) when the prompt plus max_tokens cannot fit
    in the model's context (positions 0 .. context_length - 1)."""
    if prompt_tokens + max_tokens > context_length:
        raise RequestError(f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the "
                           f"context length {context_length}", param="max_tokens")
