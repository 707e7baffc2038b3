"""Markdown markup -> plain text for speech: what a reader says aloud when an LLM reply is formatted.

Chat models format replies in Markdown ("1. **Avoid caffeine:** ...", "- 2 cups flour", "`code`",
"[docs](https://...)"); espeak reads the marks as words, and Whisper hears "asterisk", "minus", "slash" in the
speech of SmolLM2's formatted replies (docs/benchmarks.md, "Markdown read aloud").
`speakable` removes the marks and keeps every word; the reply's text (transcript) is not changed, only what
is synthesised. It works on any piece of a reply (the sentence chunker may cut "**bold**" in two): each rule
looks at one piece only.
"""
from __future__ import annotations

import re

# line-start marks: headings "## ", quotes "> ", bullets "- ", "* ", "+ ", "• " (numbered items "1." are read
# as numbers, which is what a reader says)
_LINE_MARK = re.compile(r"^[ \t]*(?:#{1,6}|>+|[-*+•])[ \t]+", re.MULTILINE)
# emphasis/strong/strike/code marks: runs of * _ ~ ` that do not sit between two word characters
# ("snake_case" and "2*3" keep theirs)
_EMPHASIS = re.compile(r"(?<!\w)[*_~`]+|[*_~`]+(?!\w)")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)\s]*\)")
_TABLE_RULE = re.compile(r"^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*$", re.MULTILINE)
_HORIZONTAL_RULE = re.compile(r"^[ \t]*(?:[-*_][ \t]*){3,}$", re.MULTILINE)
_CELL = re.compile(r"[ \t]*\|[ \t]*")
_CLAUSE_MARKS = ".,;:!?"
# C0 controls but tab and newline, and DEL: not speech, and a NUL ends the C string espeak-ng reads (Kokoro's
# phonemizer dropped the rest of the clause; Piper's bridge raised ValueError)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def speakable(text: str) -> str:
    """`text` with Markdown marks removed: headings, quotes, bullets, emphasis (* _ ~), code backticks, link
    targets (the link text stays), tables (cells read as a list) and horizontal rules. A line that ends
    without punctuation and is followed by another line gets a comma, so list items keep a pause between
    them; empty lines are dropped. Control characters (C0 but tab and newline, DEL) are read as spaces. Text
    without any of the mark or control characters comes back unchanged."""
    text = _CONTROL.sub(" ", text)
    if not any(mark in text for mark in "#>-*+•_~`[|"):
        return text
    text = _LINK.sub(r"\1", text)
    text = _HORIZONTAL_RULE.sub("", _TABLE_RULE.sub("", text))
    text = _LINE_MARK.sub("", text)
    text = _EMPHASIS.sub("", text)
    lines = [_CELL.sub(", ", line).strip(" ,") if "|" in line else line.rstrip() for line in text.split("\n")]
    lines = [line for line in lines if line.strip()]
    return "\n".join(line if line[-1] in _CLAUSE_MARKS or i == len(lines) - 1 else line + ","
                     for i, line in enumerate(lines))
