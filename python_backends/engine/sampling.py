"""Per-request sampling parameters and next-token selection for one row of logits.

The engine loop calls `sample_rows` once per step on the batch logits (`sample_next_token` per sampled
row), so every request keeps its own parameters and its own random generator.

Sampling is total: every value `SamplingParams` accepts (temperature 1e-40, top_p 1e-300, top_k
10**9, repetition_penalty 1e-30 or 1e30, penalties at +-2, any 64-bit seed) yields a token and never
NaN/inf probabilities, so one request can never raise inside an engine loop shared with others.
How: NaN logits are never picked, +inf is clamped to the largest float, masks that would remove every
token yield, logits are shifted so their maximum is 0 before dividing by the temperature (the best
token keeps probability weight 1), and a temperature below GREEDY_BELOW is greedy (as vLLM does).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from omni_backends.engine.transfer import to_device
from omni_backends.errors import RequestError

GREEDY_BELOW = 1e-5  # temperatures below this pick the argmax (vLLM's sampling epsilon)
MAX_ABS_PENALTY = 2.0  # presence/frequency penalty range, as OpenAI's API
_FLOAT_MAX = torch.finfo(torch.float32).max
# OpenAI / vLLM chat request fields that map onto SamplingParams (see request_sampling_params)
REQUEST_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed", "presence_penalty",
                  "frequency_penalty", "repetition_penalty")


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    Fields:
        max_tokens: int >= 1, the most tokens to generate (finish_reason "length" when reached).
        temperature: finite float >= 0; 0 (or anything below GREEDY_BELOW) means greedy.
        top_p: float in (0, 1]; nucleus sampling keeps the smallest set of tokens whose probability
            sums to at least top_p (1 disables it).
        top_k: int >= 0; keep the k most likely tokens (0 disables it; k >= vocab size keeps all).
        do_sample: False forces greedy decoding whatever the temperature.
        seed: int or None; seeds this request's own torch.Generator, so a seeded request draws the same
            tokens whatever else is in the batch. None draws from torch's global generator.
        stop_token_ids: token ids that end the request (finish_reason "stop"); the stop token itself is
            part of the output, as in `model.generate`.
        min_tokens: int >= 0; stop tokens are masked out until this many tokens exist.
        repetition_penalty: finite float > 0 (1 disables it); HF semantics: logits of tokens already seen
            in the prompt or output are divided by it when positive and multiplied by it when negative.
        presence_penalty: float in [-2, 2] (0 disables it); OpenAI semantics: subtracted once from the
            logit of every token already generated.
        frequency_penalty: float in [-2, 2] (0 disables it); OpenAI semantics: subtracted from a
            token's logit once per time it was generated.
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    suppress_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "suppress_token_ids", tuple(int(t) for t in self.suppress_token_ids))
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not (_is_number(self.temperature) and 0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be a boolean, got {self.do_sample!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be an integer in [0, max_tokens={self.max_tokens}], got {self.min_tokens!r}")
        if not (_is_number(self.repetition_penalty) and 0 < self.repetition_penalty < math.inf):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not (_is_number(value) and -MAX_ABS_PENALTY <= value <= MAX_ABS_PENALTY):
                raise ValueError(f"{name} must be in [-{MAX_ABS_PENALTY:g}, {MAX_ABS_PENALTY:g}], got {value!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None and not -2**63 <= self.seed < 2**63:
            raise ValueError(f"seed must be a 64-bit signed integer, got {self.seed}")
        if any(t < 0 for t in self.stop_token_ids + self.suppress_token_ids):
            raise ValueError("stop_token_ids and suppress_token_ids must be non-negative token ids")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (do_sample False, or temperature below GREEDY_BELOW)."""
        return not self.do_sample or self.temperature < GREEDY_BELOW

    @property
    def needs_output_ids(self) -> bool:
        """True when sampling reads the generated ids themselves (presence/frequency penalties)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

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


def request_sampling_params(body: Mapping[str, Any], defaults: SamplingParams) -> SamplingParams:
    """SamplingParams from an OpenAI-style request body (REQUEST_FIELDS; other keys are ignored).

    Missing or null fields keep `defaults`; top_k -1 (vLLM's "disabled") means 0.
    Raises RequestError (HTTP 400) naming the field for an invalid value.
    """
    values = {key: body[key] for key in REQUEST_FIELDS if body.get(key) is not None}
    if values.get("top_k") == -1:
        values["top_k"] = 0
    try:
        return dataclasses.replace(defaults, **values)
    except (TypeError, ValueError) as exc:
        field = next((key for key in values if str(exc).startswith(key)), None)
        raise RequestError(f"invalid sampling parameter: {exc}", param=field) from None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


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
    output_ids: torch.Tensor | None = None,
) -> int:
    """Pick the next token of one request.

    Args:
        logits: float [vocab], the request's next-token logits (not modified).
        params: the request's SamplingParams.
        seen_token_ids: int64 [n] prompt + generated ids, for repetition_penalty (ignored when it is 1).
        num_generated: tokens generated so far, for min_tokens.
        generator: the request's generator from `make_generator` (None: global RNG).
        output_ids: int64 [num_generated] the generated ids, for presence/frequency penalties.

    Returns:
        The chosen token id, in [0, vocab).

    Raises:
        ValueError: only when `logits` holds no finite value at all (a broken model, not a request value).
    """
    if not bool((logits.float().nan_to_num(nan=-math.inf) > -math.inf).any()):
        raise ValueError("the model produced no finite logit")
    scores = masked_scores(logits.float().clone(), params, seen_token_ids, num_generated, output_ids)
    if params.greedy:
        return int(scores.argmax())
    scores = (scores - scores.max()) / params.temperature  # max is 0: no overflow, no NaN
    if 0 < params.top_k < scores.numel():
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - params.top_p
        remove[-1] = False  # always keep the most likely token
        scores = scores.masked_fill(remove.scatter(0, order, remove), -math.inf)
    return int(torch.multinomial(scores.softmax(-1), 1, generator=generator))


def masked_scores(scores: torch.Tensor, params: SamplingParams, seen_token_ids: torch.Tensor | None = None,
                  num_generated: int = 0, output_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Apply the penalties, suppress_token_ids and min_tokens to one row of float scores [vocab], in place
    (returns it), leaving only finite values or -inf: NaN becomes -inf, +inf the largest float, and when
    the masks would remove every token they yield. Only device operations: no host synchronisation on
    CUDA tensors."""
    _mask_rows(scores[None], [params], [seen_token_ids], [num_generated], [output_ids])
    return scores


@functools.lru_cache(maxsize=64)
def _token_index(token_ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """int64 [n] of `token_ids` on `device`, made once per (set, device): a suppress list of 1,023 codec ids
    would otherwise be turned into a tensor and copied to the device for every row of every step."""
    return torch.tensor(token_ids, dtype=torch.long, device=device)


def _row_index(rows: Sequence[int], batch: int, device: torch.device) -> torch.Tensor | None:
    """Row indices [n, 1] on `device` for an indexed write, or None when `rows` is every row of the batch."""
    return None if len(rows) == batch else to_device(sorted(rows), torch.long, device)[:, None]


def _mask_rows(scores: torch.Tensor, params: Sequence[SamplingParams], seen_token_ids: Sequence[torch.Tensor | None],
               num_generated: Sequence[int], output_ids: Sequence[torch.Tensor | None]) -> None:
    """`masked_scores` for every row of scores [B, vocab] at once, in place: the batch-wide steps (NaN/inf
    clean-up, the copy the masks yield to, the yield itself) are one launch each, the penalties run per row
    that has them, and rows sharing a suppress or stop set are masked by one indexed write. Same values as
    masking row by row: every step is row-wise and the -inf writes commute."""
    batch, device = scores.shape[0], scores.device
    scores.nan_to_num_(nan=-math.inf, posinf=_FLOAT_MAX, neginf=-math.inf)
    yielding = [row for row, p in enumerate(params) if p.suppress_token_ids or p.min_tokens]
    raw = scores.clone() if yielding else None
    penalised = False
    for row, (p, seen, out) in enumerate(zip(params, seen_token_ids, output_ids)):
        if p.repetition_penalty != 1.0 and seen is not None and seen.numel():
            seen = seen.to(device)
            picked = scores[row, seen]
            scores[row, seen] = torch.where(picked > 0, picked / p.repetition_penalty, picked * p.repetition_penalty)
            penalised = True
        if p.needs_output_ids and out is not None and out.numel():
            ids, counts = out.to(device).unique(return_counts=True)
            scores[row, ids] -= p.presence_penalty + p.frequency_penalty * counts.to(scores.dtype)
            penalised = True
    if penalised:
        scores.nan_to_num_(nan=-math.inf, posinf=_FLOAT_MAX, neginf=-math.inf)
    groups: dict[tuple[int, ...], set[int]] = {}
    for row, (p, n) in enumerate(zip(params, num_generated)):
        if p.suppress_token_ids:
            groups.setdefault(p.suppress_token_ids, set()).add(row)
        if n < p.min_tokens and p.stop_token_ids:
            groups.setdefault(p.stop_token_ids, set()).add(row)
    for token_ids, rows in groups.items():
        index, row_index = _token_index(token_ids, device), _row_index(rows, batch, device)
        if row_index is None:
            scores[:, index] = -math.inf
        else:
            scores[row_index, index[None]] = -math.inf
    if raw is not None:   # rows with every token masked (e.g. all suppressed): the masks yield
        gone = (scores == -math.inf).all(-1, keepdim=True)
        row_index = _row_index(yielding, batch, device)
        if row_index is not None:
            gone &= torch.zeros_like(gone).index_fill_(0, row_index[:, 0], True)
        scores.copy_(torch.where(gone, raw, scores))


def greedy_pick(logits: torch.Tensor, suppress: torch.Tensor, stop: torch.Tensor, stop_rows: torch.Tensor) -> torch.Tensor:
    """`sample_rows`' tokens for greedy rows without penalties whose params share one suppress set and one stop set,
    in fixed shapes with no host synchronisation (a CUDA graph can hold it): the same clean-up, masks, yield and
    argmax, so the same ids (every row yields here; for a row that `_mask_rows` does not let yield no mask applies,
    so yielding changes nothing).

    Args:
        logits: float [B, V] (not modified). suppress: int64 [S] ids never produced. stop: int64 [T] stop ids,
            masked in the rows where stop_rows (bool [B]) is set (min_tokens not reached yet).

    Returns:
        int64 [B]: each row's id (a row whose masks remove every token takes the argmax of its unmasked logits).
    """
    scores = logits.float().nan_to_num(nan=-math.inf, posinf=_FLOAT_MAX, neginf=-math.inf)
    stop_columns = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device).index_fill_(0, stop, True)
    masked = scores.index_fill(-1, suppress, -math.inf).masked_fill(stop_rows[:, None] & stop_columns, -math.inf)
    gone = (masked == -math.inf).all(-1, keepdim=True)
    return torch.where(gone, scores, masked).argmax(-1)


def sample_rows(logits: torch.Tensor, params: Sequence[SamplingParams], seen_token_ids: Sequence[torch.Tensor | None],
                num_generated: Sequence[int], generators: Sequence[torch.Generator | None],
                output_ids: Sequence[torch.Tensor | None] | None = None) -> list[int]:
    """`sample_next_token` for every row of a batch with ONE host synchronisation for the greedy rows.

    Args:
        logits: float [B, vocab] on any device (not modified); the other arguments are per row
            (output_ids: None for all rows when no row uses presence/frequency penalties).

    Greedy rows are masked on the logits' device and picked by one batched argmax; sampled rows run
    `sample_next_token` on the CPU with their own generator, so each row's token is exactly what
    `sample_next_token` gives for it alone.
    """
    output_ids = output_ids or [None] * len(params)
    tokens: list[int | None] = [None] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:   # a copy (masked in place); every row greedy: no index tensor to build and copy to the device
        scores = logits.to(torch.float32, copy=True) if len(greedy) == len(params) else logits[greedy].float()
        _mask_rows(scores, [params[i] for i in greedy], [seen_token_ids[i] for i in greedy],
                   [num_generated[i] for i in greedy], [output_ids[i] for i in greedy])
        for i, token in zip(greedy, scores.argmax(-1).tolist()):
            tokens[i] = token
    for i, p in enumerate(params):
        if tokens[i] is None:
            tokens[i] = sample_next_token(logits[i].cpu(), p, seen_token_ids[i], num_generated[i], generators[i],
                                          output_ids[i])
    return tokens


def check_context_length(prompt_tokens: int, max_tokens: int, context_length: int,
                         prompt_param: str = "messages") -> None:
    """Raises RequestError (HTTP 400, code context_length_exceeded) when the prompt plus max_tokens cannot fit
    in the model's context (positions 0 .. context_length - 1); param is `prompt_param` ("messages", or a
    completion's "prompt") when the prompt alone cannot fit (as `omni_backends.engine.limits.check_prompt_chars`
    names it), else "max_tokens"."""
    if prompt_tokens + max_tokens > context_length:
        raise RequestError(f"prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) exceeds the "
                           f"context length {context_length}",
                           param=prompt_param if prompt_tokens >= context_length else "max_tokens",
                           code="context_length_exceeded")
