"""The bytes a media URL in a request names: a `data:` URL (base64) or an http(s) URL fetched with httpx, under a
size limit, the fetch under a time limit. Other schemes (file:, ftp:, ...) are refused: the server never reads its
own files for a client. Blocking (the fetch waits on the network): call it from a worker thread.
"""
from __future__ import annotations

import base64
import binascii
import time
from urllib.parse import urlsplit

import httpx

MAX_REDIRECTS = 5
CHUNK_BYTES = 64 * 1024


class MediaURLError(ValueError):
    """A URL whose bytes cannot be had; `str()` is the client's message, `code` the error code: invalid_url (a
    malformed URL or an unsupported scheme), too_large (past `max_bytes`), unreachable (a failed or slow fetch, or
    an HTTP error status)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def read(url: str, max_bytes: int, timeout_s: float) -> bytes:
    """The bytes `url` names: `data:[<mediatype>];base64,<data>` decoded, or the body of an http(s) GET (redirects
    followed, at most MAX_REDIRECTS) within `timeout_s` seconds in all. Raises MediaURLError (see its codes) for
    anything else, a body of more than `max_bytes` (refused from the data URL's length or the Content-Length
    header before reading it, else when the read passes it) or a fetch that fails, answers a non-2xx status or
    takes longer than `timeout_s`."""
    if not isinstance(url, str) or not url:
        raise MediaURLError("the URL must be a non-empty string", "invalid_url")
    scheme = urlsplit(url).scheme.lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, max_bytes)
    if scheme in ("http", "https"):
        return _fetch(url, max_bytes, timeout_s)
    raise MediaURLError(f"URL scheme {scheme or '(none)'!r} is not supported: send a data: URL (base64) or an "
                        "http(s) URL", "invalid_url")


def _data_url(url: str, max_bytes: int) -> bytes:
    header, comma, data = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise MediaURLError("a data: URL must be data:<media type>;base64,<data>", "invalid_url")
    if len(data) // 4 * 3 > max_bytes + 2:
        raise MediaURLError(f"the data: URL holds about {len(data) // 4 * 3} bytes; at most {max_bytes}", "too_large")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaURLError(f"the data: URL is not valid base64: {exc}", "invalid_url") from None
    if len(raw) > max_bytes:
        raise MediaURLError(f"the data: URL holds {len(raw)} bytes; at most {max_bytes}", "too_large")
    return raw


def _fetch(url: str, max_bytes: int, timeout_s: float) -> bytes:
    deadline = time.monotonic() + timeout_s
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=True, max_redirects=MAX_REDIRECTS) as client, \
                client.stream("GET", url) as response:
            if not response.is_success:
                raise MediaURLError(f"fetching the URL answered HTTP {response.status_code}", "unreachable")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise MediaURLError(f"the URL's body is {declared} bytes; at most {max_bytes}", "too_large")
            body = bytearray()
            for chunk in response.iter_bytes(CHUNK_BYTES):
                body += chunk
                if len(body) > max_bytes:
                    raise MediaURLError(f"the URL's body is more than {max_bytes} bytes", "too_large")
                if time.monotonic() > deadline:
                    raise MediaURLError(f"fetching the URL took more than {timeout_s:g} s", "unreachable")
            return bytes(body)
    except httpx.TimeoutException:
        raise MediaURLError(f"fetching the URL took more than {timeout_s:g} s", "unreachable") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise MediaURLError(f"the URL could not be fetched: {exc}", "unreachable") from None
