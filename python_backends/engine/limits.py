"""Prompt-size checks of engine stages, done before any expensive work.

`check_prompt_chars` rejects an absurd prompt from its character count alone, BEFORE tokenizing it:
no token of a vocabulary spans more than `longest_token_chars(tokenizer)` characters, so a text of
n characters has at least ceil(n / longest) tokens; if that lower bound alone exceeds the context,
tokenizing (which took 25-35 s and +2.7 GB for a 20 MB prompt) is pointless. Prompts that pass are
at most context_length * longest characters, so their tokenization is bounded too. The exact check
after tokenizing is `omni_backends.engine.sampling.check_context_length`.
"""
from __future__ import annotations

import math

from omni_backends.errors import RequestError


def longest_token_chars(tokenizer) -> int:
    """Most characters any single token of `tokenizer`'s vocabulary (added tokens included) can stand
    for. Byte-level BPE token strings hold one symbol per byte, so their length bounds the decoded text."""
    return max(len(token) for token in tokenizer.get_vocab())


def check_prompt_chars(chars: int, max_tokens: int, context_length: int, longest_token: int,
                       prompt_param: str = "messages") -> None:
    """Raises RequestError (HTTP 400) when a prompt of `chars` characters cannot fit the context whatever
    its tokenization (at least ceil(chars / longest_token) tokens plus max_tokens); param is `prompt_param`
    ("messages", or a completion's "prompt") when the prompt alone cannot fit, else "max_tokens"."""
    least = math.ceil(chars / max(longest_token, 1))
    if least + max_tokens > context_length:
        raise RequestError(f"the {prompt_param} hold{'s' if prompt_param == 'prompt' else ''} {chars} characters: at "
                           f"least {least} tokens, which with max_tokens ({max_tokens}) exceeds the context length "
                           f"{context_length}",
                           param=prompt_param if least >= context_length else "max_tokens",
                           code="context_length_exceeded")

