"""Edge validation, before any route work: the request body's size (BodyLimitMiddleware) and its
text (require_valid_text).

Every string of a JSON request body (values and keys, at any depth, extension fields included) must
be encodable Unicode before anything reaches a tokenizer, phonemizer or encoder; every text field of a
multipart form must be valid UTF-8 (read_form: Starlette reads an invalid one as Latin-1, a text the client
never sent).

JSON may spell a lone UTF-16 surrogate ("\\ud800"); Python's json module turns it into a str that
no UTF-8 encoder accepts, so it would fail deep inside a stage. Multipart form fields (read as UTF-8 only),
query strings and paths cannot carry one.

Value formats more than one route checks live here too (LANGUAGE_CODE), the walker that refuses fields this
server does not honour (refuse_unsupported), for the HTTP routes and the realtime session alike, and the base of
the JSON body models (RequestModel: null means the default).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from contextlib import aclosing

from fastapi import Request
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from pydantic import BaseModel, model_validator
from starlette.requests import HTTPConnection
from starlette.exceptions import HTTPException

from omni_frontend.errors import APIError, bad_request

# an ISO-639-1 (or -3) language code as Whisper takes it: /v1/audio/transcriptions `language`, realtime
# `audio.input.transcription.language`
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")


class RequestModel(BaseModel):
    """Base of the JSON request-body models: JSON null for an optional field means its default, as OpenAI's API
    reads its nullable fields (`"n": null`, `"stream": null`, `"response_format": null`); clients that serialise
    unset fields as null (hand-written models, proxies) send exactly that. Required fields stay required (null
    for one is a 400 naming it); fields whose default is None took null already."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {key: value for key, value in data.items()
                if value is not None or key not in fields or fields[key].is_required() or fields[key].default is None}


def refuse_unsupported(spec: dict, fields: Mapping[str, tuple[tuple, str]],
                       error: Callable[[str, str], Exception]) -> None:
    """Raises `error(path, why)` for the first of `fields` (a field's dotted path in `spec` -> (values that change
    nothing, why it is not supported)) that `spec` sets to another value; an absent field (a key missing on the
    way) changes nothing. Values compare as JSON values: `false` is not `0` (`same_json`).

    The error is the caller's, as its protocol spells it: the HTTP routes raise APIError 400 code
    `unsupported_parameter` (chat_protocol.unsupported_parameter), the realtime session a ProtocolError code
    `unsupported_feature` (realtime.config.unsupported_feature)."""
    for path, (inert, why) in fields.items():
        value = spec
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            if not any(same_json(value, candidate) for candidate in inert):
                raise error(path, why)


def same_json(value, other) -> bool:
    """`value == other` as JSON values: 0 == False in Python, but a JSON boolean is not the number 0 (and vice
    versa)."""
    return value == other and isinstance(value, bool) == isinstance(other, bool)


class _InvalidField(MultiPartException):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class _StrictMultiPartParser(MultiPartParser):
    """Starlette's multipart parser, except that a text field which is not valid UTF-8 is an error (Starlette
    decodes it as Latin-1)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                part.data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _InvalidField(part.field_name, f"form field {part.field_name} is not valid UTF-8: byte "
                                                     f"{exc.start} is 0x{part.data[exc.start]:02x}") from None
        super().on_part_end()


async def read_form(request: Request, max_part_size: int) -> FormData:
    """`request.form(max_part_size=...)` with every multipart text field checked to be UTF-8. Raises APIError 400:
    code `invalid_unicode` naming the field (as for a JSON body's invalid text), or Starlette's message for a
    malformed body."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return await request.form(max_part_size=max_part_size)
    try:
        async with aclosing(request.stream()) as stream:
            form = await _StrictMultiPartParser(request.headers, stream, max_part_size=max_part_size).parse()
    except _InvalidField as exc:
        raise bad_request(exc.message, param=exc.field, code="invalid_unicode") from None
    except MultiPartException as exc:
        raise APIError(400, exc.message) from None
    request._form = form   # Starlette closes the uploaded files with the request, as for its own parse
    return form


class BodyLimitMiddleware:
    """Pure ASGI middleware: a request body over `max_bytes` gets 413 in the OpenAI envelope (with
    `Connection: close`) without being parsed. A declared Content-Length is refused before the body
    is read; a chunked body is counted as it arrives and refused when it passes the limit (the
    HTTPException reaches the app's handler, which renders the same envelope). Starlette's own
    limiter answers a declared length with plain text, hence this one."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes
        self.message = f"request body exceeds the {max_bytes} byte limit (--max-body-bytes)"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            error = APIError(413, self.message, code="request_too_large", headers={"connection": "close"})
            return await error.response()(scope, receive, send)
        seen = 0

        async def counting_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self.message, headers={"connection": "close"})
            return message

        await self.app(scope, counting_receive, send)


def invalid_text(value) -> tuple[str, int] | None:
    """(JSON path, character index) of the first string in `value` that is not encodable Unicode
    (a lone surrogate), or None. `value` is parsed JSON (dict / list / scalars); iterative, so any
    nesting depth is fine. Paths look like `messages[0].content[1].text`."""
    stack = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            index = _bad_index(item)
            if index is not None:
                return path or "body", index
        elif isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                index = _bad_index(key)
                if index is not None:
                    return (f"{path}.{key!a}" if path else f"{key!a}"), index
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def _bad_index(text: str) -> int | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


async def require_valid_text(connection: HTTPConnection) -> None:
    """App-wide FastAPI dependency: 400 (code `invalid_unicode`, param = the field's path) when the
    JSON body holds a string that is not valid Unicode. It reads the body FastAPI has already parsed
    (Starlette caches it), so nothing is parsed twice; non-JSON bodies are left to their routes, and
    WebSocket routes (no body; their events are checked by the route) pass through."""
    if not isinstance(connection, Request) or connection.method not in ("POST", "PUT", "PATCH") \
            or "json" not in connection.headers.get("content-type", ""):
        return
    request = connection
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return  # FastAPI reports invalid JSON itself
    found = invalid_text(body)
    if found:
        param, index = found
        raise bad_request(f"{param} is not valid Unicode: it holds a lone UTF-16 surrogate at character {index} "
                          "(send text as UTF-8, or escape characters outside the BMP as surrogate pairs)",
                          param=param, code="invalid_unicode")
