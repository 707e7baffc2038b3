"""Sentence chunker for LLM -> TTS streaming: turns text deltas into speakable chunks.

Chunks start small and grow toward sentences, so speech starts while the LLM is still writing (a first
chunk of 2-3 words is heard ~0.5 s after its text, where a sentence takes seconds) and each next chunk is
synthesised while the previous one plays (Kokoro's cost is about proportional to the audio it makes, so a
chunk up to ~2x longer than the one playing is ready about in time):
- chunk 0 ends at the first clause boundary (, ; : or a sentence end) once it holds `first_min_words`
  words, or after `first_max_words` words when no boundary came;
- chunk k > 0 ends at a sentence end (. ! ?) once it holds `min_words` words, or at a clause boundary
  once it holds `first_min_words * growth**k` words (so after a few chunks only sentences end chunks);
- a line break always ends a chunk; chunk k holds at most `first_max_words * growth**k` words (and never
  more than `max_words`): a longer one is cut at its last clause boundary (or, without one, at a word
  boundary).
With `clauses=False` (the in-process sentence baseline of `scripts/bench --baseline inprocess`) only sentence ends
(once the chunk holds `min_words` words), line breaks and chunks over `max_words` words end a chunk:
first_min_words, first_max_words and growth are then unused.
A boundary counts only once the character after it has arrived and is whitespace ("3.5" and "1,000"
stay whole), and common abbreviations ("Mr.", "e.g.") do not end a sentence. `flush()` returns the rest.
A piece without a word (an emoji-only reply "👍", the "🎉" after "Great job!", a "---" line) is dropped, or with
`keep_wordless=True` (the voice chat, whose audio transcript must hold the whole answer) returned as a chunk of
its own that `has_words` tells apart and that does not count toward the growth.
Joining the chunks with single spaces gives back the text with its whitespace runs collapsed (less the wordless
pieces unless they are kept).
"""
from __future__ import annotations

import itertools
import math
import re

_SENTENCE_MARKS = frozenset(".!?")
_CLAUSE_END = re.compile(r"[.!?,;:]+[\"')\]]*(?=\s)| [-–—](?= )")
_WORD = re.compile(r"\w+(?:['’.-]\w+)*")
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "vs", "etc", "e.g", "i.e", "jr", "sr", "prof"}


class SentenceChunker:
    """Feed text deltas with `feed`, get speakable chunks (stripped, never empty); call `flush` at the end."""

    def __init__(self, first_min_words: int = 2, first_max_words: int = 3, min_words: int = 4, max_words: int = 40,
                 growth: float = 2.0, clauses: bool = True, keep_wordless: bool = False):
        self.first_min_words, self.first_max_words = first_min_words, first_max_words
        self.min_words, self.max_words, self.growth, self.clauses = min_words, max_words, growth, clauses
        self.keep_wordless = keep_wordless
        self._buffer = ""
        self._emitted = 0  # chunks returned since the last flush

    def feed(self, delta: str) -> list[str]:
        """Add a text delta; return the chunks it completed (possibly none), in order."""
        self._buffer += delta
        chunks = []
        while (end := self._next_cut()) is not None:
            chunks += self._take(end)
        return chunks

    def buffered(self) -> str:
        """The text fed since the last chunk that no chunk holds yet."""
        return self._buffer

    def flush(self) -> list[str]:
        """Return whatever text is left (at most one chunk) and reset for the next stream."""
        chunks = self._take(len(self._buffer))
        self._emitted = 0
        return chunks

    def _next_cut(self) -> int | None:
        """End index of the next chunk in the buffer, or None while more text is needed."""
        newline = self._buffer.find("\n")  # a line break always ends a chunk (lists, paragraphs)
        if self.clauses:
            clause_min = self.first_min_words * self.growth ** self._emitted
            sentence_min = self.min_words if self._emitted else self.first_min_words
            limit = min(self.max_words, round(self.first_max_words * self.growth ** self._emitted))
        else:
            clause_min, sentence_min, limit = math.inf, self.min_words, self.max_words
        for match, words, last_word in self._boundaries(len(self._buffer) if newline < 0 else newline):
            if words > limit:
                break
            sentence = not _SENTENCE_MARKS.isdisjoint(match.group())
            if words >= (min(sentence_min, clause_min) if sentence else clause_min) \
                    and not _abbreviation(match, last_word):
                return match.end()
        if newline >= 0:
            return newline + 1
        if _word_count(self._buffer) > limit:
            return self._long_cut(limit)
        return None

    def _long_cut(self, limit: int) -> int:
        """Cut an over-long chunk at its last clause boundary within `limit` words (one that leaves at least
        `first_min_words` words), else after word `limit`. Looks no further than word `limit` + 1."""
        words = list(itertools.islice(_WORD.finditer(self._buffer), limit + 1))
        end = words[limit].start() if len(words) > limit else len(self._buffer)
        cut = None
        for match, count, _ in self._boundaries(end):
            if self.first_min_words <= count <= limit:
                cut = match.end()
        return words[limit - 1].end() if cut is None else cut

    def _boundaries(self, endpos: int):
        """(clause-end match, words up to its end, the last of those words or None) for each boundary before
        `endpos`, in order; words are counted one stretch at a time (a word never spans a boundary, which is
        followed by whitespace), so scanning is linear in the text (counting each prefix anew was quadratic:
        seconds of a stage's event loop for one 4 KB speech input)."""
        words, start, last_word = 0, 0, None
        for match in _CLAUSE_END.finditer(self._buffer, 0, endpos):
            found = _WORD.findall(self._buffer, start, match.end())
            words, start = words + len(found), match.end()
            last_word = found[-1] if found else last_word
            yield match, words, last_word

    def _take(self, end: int) -> list[str]:
        chunk, self._buffer = self._buffer[:end].strip(), self._buffer[end:].lstrip()
        if not has_words(chunk):
            return [chunk] if chunk and self.keep_wordless else []
        self._emitted += 1
        return [chunk]


def has_words(text: str) -> bool:
    """Whether `text` holds a word (letters or digits) to speak; a chunk without one is not spoken."""
    return _WORD.search(text) is not None


def _word_count(text: str) -> int:
    return len(_WORD.findall(text))


def _abbreviation(match: re.Match, last_word: str | None) -> bool:
    """Whether the sentence end `match`, after the word `last_word`, is the period of an abbreviation ("Mr.")."""
    return last_word is not None and match.group().endswith(".") and last_word.lower() in _ABBREVIATIONS
