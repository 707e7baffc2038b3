"""Client-controlled text made safe to show: bounded in the error messages that quote it (`clipped`), escaped and
bounded in the log lines that name it (`printable`).

A client may send any text where a name is expected (a model of 1 MB, a field name of 100 000 characters, a path with
a percent-encoded newline); the errors and logs that quote it must neither grow with it nor let it forge a log line.
"""
from __future__ import annotations

MAX_MESSAGE_CHARS = 2048   # an error message (HTTP envelope, WebSocket error event)
MAX_PARAM_CHARS = 256      # an error's `param` (a field path)
MAX_LOGGED_CHARS = 1024    # one client value in a log line


def clipped(text: str | None, limit: int) -> str | None:
    """`text` when it has at most `limit` characters, else its start and end around a note of how many characters
    were left out ("…[12345 characters]…"), `limit` characters in all (`limit` >= 64). None stays None."""
    if text is None or len(text) <= limit:
        return text
    note_len = len(f"…[{len(text)} characters]…")
    head = (limit - note_len) * 3 // 4
    tail = limit - note_len - head
    return f"{text[:head]}…[{len(text) - head - tail} characters]…{text[len(text) - tail:]}"


def error_text(message: str, param: str | None) -> tuple[str, str | None]:
    """An error's (message, param), which quote client input, `clipped` to MAX_MESSAGE_CHARS and MAX_PARAM_CHARS: the
    one bound of every error the server sends (HTTP envelope, realtime and speech WebSocket error events)."""
    return clipped(message, MAX_MESSAGE_CHARS), clipped(param, MAX_PARAM_CHARS)


def printable(text: str, limit: int = MAX_LOGGED_CHARS) -> str:
    """`text` for a log line: every character that is not printable (newlines, escape sequences, NUL, the Unicode
    line and paragraph separators) written as its Python escape (`\\n`, `\\x1b`, `\\u2028`), then `clipped` to
    `limit` characters."""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return clipped(escaped, limit)
