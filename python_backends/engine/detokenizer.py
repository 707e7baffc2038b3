"""Streaming token -> text with per-request state, and stop-string matching on the streamed text.

`IncrementalDetokenizer` uses prefix/read offsets (as vLLM and TGI do): each new token is decoded
together with the tokens since the last emitted boundary, and the text is released only when it no
longer ends in an incomplete UTF-8 sequence. So a multi-byte character split over several byte-level
tokens is never emitted as U+FFFD, and leading spaces are kept (a lone token is never decoded).
Whether a trailing U+FFFD of the decode is an incomplete character or a real one (bytes EF BF BD the model
wrote) is told from the tokens' bytes (`_ends_incomplete`): a real one is emitted at once, an incomplete one is
held back, and at the end of the stream (`flush`: max_tokens cut inside the character, or end of turn) it is
dropped, as OpenAI drops it, never sent as U+FFFD.
Made for HF fast tokenizers with byte-level BPE (GPT-2, Qwen, SmolLM2); the concatenated deltas plus
`flush()` equal `tokenizer.decode(all_ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)`,
less a trailing incomplete character.
"""
from __future__ import annotations

import codecs
import functools
import re
from typing import Sequence

from transformers.convert_slow_tokenizer import bytes_to_unicode

REPLACEMENT_CHAR = "\ufffd"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a byte-level BPE token spells each byte with -> the byte
    (transformers' `bytes_to_unicode`)."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def incomplete_utf8_tail(data: bytes) -> bytes:
    """The bytes at the end of `data` that start a UTF-8 character and lack its last byte(s) (b"" when none):
    what a byte-level BPE gives when a token stream is cut inside a multi-byte character."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(data, final=False)
    return decoder.getstate()[0]


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
        self._special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())

    def add(self, token_ids: int | Sequence[int]) -> str:
        """Append generated token id(s); return the newly complete text ("" while a character is incomplete)."""
        self.token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or (
                new_text.endswith(REPLACEMENT_CHAR) and self._ends_incomplete(self.token_ids[self._read_offset :])):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """End of stream: return the held-back rest, less a trailing incomplete character (the stream was cut
        inside it: its bytes decode to U+FFFD, which is dropped; a real U+FFFD the model wrote is kept)."""
        prefix_text = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self.token_ids[self._prefix_offset :])
        rest = new_text[len(prefix_text) :]
        if rest.endswith(REPLACEMENT_CHAR) and self._ends_incomplete(self.token_ids[self._read_offset :]):
            rest = rest[:-1]
        self._prefix_offset = self._read_offset = len(self.token_ids)
        return rest

    def _ends_incomplete(self, ids: Sequence[int]) -> bool:
        """Whether the text of `ids` ends inside a multi-byte character (so its decode's trailing U+FFFD is not a
        character of the answer). Told from the tokens' bytes; when they cannot be read (a tokenizer that is
        neither byte-level BPE nor SentencePiece with byte fallback), a trailing U+FFFD counts as incomplete."""
        data = self._bytes(ids)
        return True if data is None else bool(incomplete_utf8_tail(data))

    def _bytes(self, ids: Sequence[int]) -> bytes | None:
        """The UTF-8 bytes the tokens `ids` spell (skipped special tokens left out), or None if unknown."""
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        byte_of = _byte_decoder()
        out = bytearray()
        for token_id, token in zip(ids, self.tokenizer.convert_ids_to_tokens(list(ids))):
            if token_id in self._special_ids and self.skip_special_tokens:
                continue
            if token is None:
                return None
            if token_id in added:
                out += str(added[token_id].content if hasattr(added[token_id], "content") else token).encode()
            elif (match := _BYTE_TOKEN.fullmatch(token)) is not None:
                out.append(int(match.group(1), 16))
            elif all(ch in byte_of for ch in token):
                out += bytes(byte_of[ch] for ch in token)
            else:
                return None
        return bytes(out)

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
