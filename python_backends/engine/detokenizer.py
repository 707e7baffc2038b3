"""Streaming token -> text with per-request state, and stop-string matching on the streamed text.

`IncrementalDetokenizer` uses prefix/read offsets (as vLLM and TGI do): each new token is decoded
together with the tokens since the last emitted boundary, and the text is released only when it no
longer ends in an incomplete UTF-8 sequence. So a multi-byte character split over several byte-level
tokens is never emitted as U+FFFD, and leading spaces are kept (a lone token is never decoded).
Made for HF fast tokenizers with byte-level BPE (GPT-2, Qwen, SmolLM2); the concatenated deltas plus
`flush()` equal `tokenizer.decode(all_ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)`.
"""
from __future__ import annotations

from typing import Sequence

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Per-request incremental decoder.

    Args:
        tokenizer: an HF tokenizer (anything with `decode(ids, skip_special_tokens=...,
            clean_up_tokenization_spaces=...)`).
        skip_special_tokens: drop special tokens from the text.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # start of the window re-decoded for context
        self._read_offset = 0  # tokens before this are already emitted

    def add(self, token_ids: int | Sequence[int]) -> str:
        """Append generated token id(s); return the newly complete text ("" while a character is incomplete)."""
        self.token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """End of stream: return the held-back rest (an incomplete character decodes to U+FFFD here)."""
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self.token_ids)
        return new_text[len(prefix_text) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, clean_up_tokenization_spaces=False
        )


class StopStringMatcher:
    """Cuts streamed text at the first stop string, holding back text that may start one.

    Args:
        stop: stop strings (empty strings are ignored). The stop string itself is not emitted.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(s for s in stop if s)
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> tuple[str, bool]:
        """Add streamed text.

        Returns:
            (text to emit now, stopped): once stopped is True the stream must end; further calls return ("", True).
        """
        if self.stopped:
            return "", True
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[: min(hits)], True
        hold = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """End of stream without a stop: return the held-back text."""
        held, self._held = self._held, ""
        return held
