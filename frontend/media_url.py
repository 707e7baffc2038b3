"""The bytes a media URL in a request names: a `data:` URL (base64) or an http(s) URL fetched with httpx, under a
size limit, the fetch under a time limit. Other schemes (file:, ftp:, ...) are refused: the server never reads its
own files for a client. Blocking (the fetch waits on the network): call it from a worker thread.

Server-side request forgery: a client must not make the server fetch what only the server can reach (a cloud
metadata service at 169.254.169.254, an admin port on localhost, hosts of a private network). Unless
`allow_private` (--allow-private-media-urls), every host a fetch goes to, each redirect's too, must resolve to
public addresses only (`ipaddress.is_global`); with `allowed_domains` (--allowed-media-domains, as vLLM's flag) the
host must also be one of them or under one. The check resolves the name before httpx connects, which resolves it
again: a DNS answer that changes between the two (rebinding) is not caught; deploy an egress proxy where that matters.
"""
from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
import time
from urllib.parse import urlsplit

import httpx

MAX_REDIRECTS = 5


class MediaURLError(ValueError):
    """A URL whose bytes cannot be had; `str()` is the client's message, `code` the error code: invalid_url (a
    malformed URL or an unsupported scheme), not_allowed (a host the server may not fetch from), too_large (past
    `max_bytes`), unreachable (a failed or slow fetch, or an HTTP error status)."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def read(url: str, max_bytes: int, timeout_s: float, allowed_domains: tuple[str, ...] = (),
         allow_private: bool = False) -> bytes:
    """The bytes `url` names: `data:[<mediatype>];base64,<data>` decoded, or the body of an http(s) GET (redirects
    followed, at most MAX_REDIRECTS, each checked as the first URL) within `timeout_s` seconds in all (checked as each
    piece of the body arrives; httpx bounds each wait for one by `timeout_s`, so a trickle ends within 2 x). Raises
    MediaURLError (see its codes) for anything else, a host not allowed (see the module doc), a body of more than
    `max_bytes` (refused from the data URL's length or the Content-Length header before reading it, else when the
    read passes it) or a fetch that fails, answers a non-2xx status or takes longer than `timeout_s`."""
    if not isinstance(url, str) or not url:
        raise MediaURLError("the URL must be a non-empty string", "invalid_url")
    scheme = urlsplit(url).scheme.lower() if ":" in url else ""
    if scheme == "data":
        return _data_url(url, max_bytes)
    if scheme in ("http", "https"):
        return _fetch(url, max_bytes, timeout_s, lambda hop: _check_host(hop, allowed_domains, allow_private))
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


def _check_host(url: httpx.URL, allowed_domains: tuple[str, ...], allow_private: bool) -> None:
    """Raises MediaURLError not_allowed unless `url`'s host may be fetched from (see the module doc)."""
    host = url.host.lower().rstrip(".")
    if allowed_domains and not any(host == d or host.endswith("." + d) for d in allowed_domains):
        raise MediaURLError(f"host {host!r} is not among the server's --allowed-media-domains", "not_allowed")
    if allow_private:
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, url.port or 443, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError) as exc:
        raise MediaURLError(f"the URL's host {host!r} could not be resolved: {exc}", "unreachable") from None
    for address in sorted(addresses):
        if not ipaddress.ip_address(address.split("%")[0]).is_global:
            raise MediaURLError(f"host {host!r} is a private or local address ({address}); the server fetches only "
                                "public addresses unless started with --allow-private-media-urls", "not_allowed")


def _fetch(url: str, max_bytes: int, timeout_s: float, check) -> bytes:
    deadline = time.monotonic() + timeout_s
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
            request = client.build_request("GET", url)
            for _ in range(MAX_REDIRECTS + 1):
                check(request.url)
                response = client.send(request, stream=True)
                try:
                    if response.is_redirect and response.next_request is not None:
                        request = response.next_request
                        continue
                    return _body(response, max_bytes, timeout_s, deadline)
                finally:
                    response.close()
            raise MediaURLError(f"fetching the URL was redirected more than {MAX_REDIRECTS} times", "unreachable")
    except httpx.TimeoutException:
        raise MediaURLError(f"fetching the URL took more than {timeout_s:g} s", "unreachable") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise MediaURLError(f"the URL could not be fetched: {exc}", "unreachable") from None


def _body(response: httpx.Response, max_bytes: int, timeout_s: float, deadline: float) -> bytes:
    if not response.is_success:
        raise MediaURLError(f"fetching the URL answered HTTP {response.status_code}", "unreachable")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise MediaURLError(f"the URL's body is {declared} bytes; at most {max_bytes}", "too_large")
    body = bytearray()
    for chunk in response.iter_bytes():   # as it comes: a chunk size waits for that many bytes (a trickle: for hours)
        body += chunk
        if len(body) > max_bytes:
            raise MediaURLError(f"the URL's body is more than {max_bytes} bytes", "too_large")
        if time.monotonic() > deadline:
            raise MediaURLError(f"fetching the URL took more than {timeout_s:g} s", "unreachable")
    return bytes(body)
