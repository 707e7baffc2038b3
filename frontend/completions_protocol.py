"""OpenAI (legacy) completions request validation, vLLM's field set, and its mapping onto chat pipeline REQUESTs.

A completion's prompt reaches the pipeline's LLM as it is, without the chat template: each prompt is one pipeline
REQUEST whose `prompt` (text, or token ids) replaces `messages` (omni_backends.chat_request.check_prompt):
  {"prompt": str | [int], "modalities": ["text"], "temperature", "top_p", "top_k", "max_tokens", "seed",
   "presence_penalty", "frequency_penalty", "repetition_penalty", "stop": [str], ...extension fields}
"""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from omni_frontend.chat_protocol import (UNSUPPORTED_FIELDS, GenerationFields, extensions, stop_sequences,
                                        unsupported_parameter)
from omni_frontend.config import RequestLimits
from omni_frontend.errors import bad_request
from omni_frontend.validation import refuse_unsupported

Prompt = str | list[int]   # one prompt: text, or token ids


class CompletionRequest(GenerationFields):
    """POST /v1/completions: the OpenAI fields and vLLM's sampling extensions we honour. `prompt`: a string, a list
    of strings, a list of token ids or a list of such lists (several prompts: one choice each, `index` = the
    prompt's position). Unknown fields (extra_body) are passed to the pipeline as chat's are (the route refuses those
    it does not read, 400 naming the field); `n` > 1, `best_of` > 1, `suffix`, `logprobs` and `logit_bias` are
    refused by `check_supported` (400 `unsupported_parameter` naming the field)."""

    MAX_PROMPTS: ClassVar[int] = 32
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(default=16, ge=1, description="tokens to generate at most (OpenAI's default 16)")
    echo: bool = False
    user: str | None = None
    n: int = Field(default=1, ge=1, description="only 1 is supported")
    best_of: int | None = Field(default=None, ge=1, description="only 1 is supported")
    suffix: str | None = Field(default=None, description="not supported")
    logprobs: int | None = Field(default=None, ge=0, description="not supported")
    logit_bias: dict[str, float] | None = Field(default=None, description="not supported")


_REFUSED = {"n": (1,), "best_of": (None, 1), "suffix": (None,), "logprobs": (None,), "logit_bias": (None, {})}


def check_supported(req: CompletionRequest) -> None:
    """Raises APIError 400 (code `unsupported_parameter`, param = the field) for n > 1, best_of > 1, a suffix,
    logprobs, a logit_bias, or an extension field that would change the answer and that no pipeline honours
    (chat_protocol.UNSUPPORTED_FIELDS: tools, response_format, ...); and (param `stream_options`) stream_options
    without stream."""
    for name, inert in _REFUSED.items():
        if getattr(req, name) not in inert:
            raise unsupported_parameter(name, "only one choice per prompt, without log probabilities, suffix or logit "
                                        "bias, is generated")
    refuse_unsupported(req.model_extra or {}, UNSUPPORTED_FIELDS, unsupported_parameter)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options",
                          code="unsupported_parameter")


# what a token id of a prompt counts towards --max-text-chars: a BPE token's typical length in characters
TOKEN_CHARS = 4


def prompts(req: CompletionRequest, limits: RequestLimits | None = None) -> list[Prompt]:
    """The request's prompts, one per choice: [text] or [token ids] for one prompt, the list for several. Raises
    APIError 400 (param "prompt") for no prompt, more than MAX_PROMPTS, or more than --max-text-chars characters of
    text in all, a token id counting TOKEN_CHARS (code `text_too_long`)."""
    limits = limits or RequestLimits()
    prompt = req.prompt
    found: list[Prompt] = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else prompt
    if not found:
        raise bad_request("prompt must not be empty", param="prompt")
    if len(found) > req.MAX_PROMPTS:
        raise bad_request(f"{len(found)} prompts; at most {req.MAX_PROMPTS}", param="prompt")
    chars = sum(len(p) if isinstance(p, str) else TOKEN_CHARS * len(p) for p in found)
    if chars > limits.max_text_chars:   # 32 prompts of 8000 ids each held the CPU for minutes
        raise bad_request(f"the prompts hold {chars} characters (a token id counts as {TOKEN_CHARS}); the limit is "
                          f"{limits.max_text_chars} (--max-text-chars)", param="prompt", code="text_too_long")
    return found


def to_pipeline(req: CompletionRequest, limits: RequestLimits | None = None) -> list[dict]:
    """The pipeline REQUEST of each prompt (see the module doc), text out only. Raises APIError 400 as
    `check_supported`, `prompts` and chat_protocol.stop_sequences."""
    limits = limits or RequestLimits()
    check_supported(req)
    stop = stop_sequences(req.stop, limits)
    fields = {**extensions(req), "modalities": ["text"], "temperature": req.temperature, "top_p": req.top_p,
              "top_k": req.top_k, "max_tokens": req.max_tokens, "seed": req.seed, "stop": stop,
              "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
              "repetition_penalty": req.repetition_penalty}
    return [{**fields, "prompt": prompt} for prompt in prompts(req, limits)]
