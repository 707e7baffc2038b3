"""OpenAI error envelope: every error leaves the frontend as
`{"error": {"message", "type", "param", "code"}}` with a matching HTTP status.

Pipeline models report request errors through Triton error responses whose message is this same
envelope as JSON (see omni_backends.triton.events.error_message); `from_triton_message` maps them back.
"""
from __future__ import annotations

import json
import logging
import re

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from omni_frontend.client_text import error_text
from omni_frontend.observability import SlowClient

log = logging.getLogger("omni_frontend")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout",
}


class EnvelopeResponse(JSONResponse):
    """JSONResponse rendered with ASCII escapes: an error message that quotes client input (which may
    hold text no UTF-8 encoder accepts, such as a lone surrogate) can always be sent."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


class APIError(Exception):
    """An error with an HTTP status, rendered as the OpenAI envelope; `headers` go on the response
    (e.g. Retry-After on 429). `message` and `param` quote client input (a model name, a field name), so they are
    clipped (client_text.error_text): a 1 MB model name is not echoed."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        message, param = error_text(message, param)
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return EnvelopeResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_triton_message(message: str) -> APIError:
    """Maps a Triton error message to an APIError.

    A pipeline model that rejects a request sends the OpenAI envelope as JSON in the message
    (status in `error.status`, default 400); anything else is an internal failure (500) whose
    text is passed on so the operator can find it in the logs.
    """
    start = message.find("{")
    if start >= 0:
        try:
            err = json.loads(message[start:])["error"]
            return APIError(int(err.get("status", 400)), err["message"], param=err.get("param"),
                            code=err.get("code"), type=err.get("type"))
        except (ValueError, KeyError, TypeError):
            pass
    if "is not healthy" in message:  # Triton: the model's stub process died
        return APIError(503, f"model unavailable: {message}", code="model_unavailable")
    return APIError(500, f"inference failed: {message}", code="inference_error")


# pydantic's names of a union's members in an error's location (`str`, `list[str]`, `dict[any,any]`, a model class)
_UNION_TAG = re.compile(r"^(str|int|float|bool|bytes|none|list\[.*\]|dict\[.*\]|tuple\[.*\]|set\[.*\]|literal\[.*\]|"
                        r"(function|json)-[a-z-]+\[.*\]|[A-Z][A-Za-z0-9]*)$")


def validation_error(errors, where: str) -> APIError:
    """The 400 for pydantic's `errors` (a ValidationError's `.errors()`) of a request to `where` (e.g. "POST
    /v1/audio/speech"): the first error, its location as `param` (dotted, without FastAPI's "body" prefix); code
    `invalid_json`, `unsupported_parameter` (a field the model forbids) or `invalid_value`."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    msg = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        return APIError(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}",
                        code="invalid_json")
    tag = next((i for i, p in enumerate(loc) if _UNION_TAG.match(p)), None) if first.get("type") != "extra_forbidden" \
        else None
    if tag is not None:
        # a value none of a union's members took (`stop: 5`, content `["hi"]`): pydantic names each member (`stop.str`,
        # `stop.list[str]`), which is no field of the request; the param is the union's field, the message each
        # member's complaint
        param, complaints = ".".join(loc[:tag]), []
        for error in errors:
            where = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "header")]
            if where[:tag] == loc[:tag] and len(where) > tag and _UNION_TAG.match(where[tag]):
                inner = ".".join(p for p in where[tag + 1:] if not _UNION_TAG.match(p))
                complaint = f"{param}.{inner}: {error.get('msg')}" if inner else error.get("msg")
                if complaint not in complaints:
                    complaints.append(complaint)
        return APIError(400, f"{param}: {'; or '.join(complaints)}", param=param or None, code="invalid_value")
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":   # as a pipeline refuses a field it does not read
        return APIError(400, f"{param} is not a request field of {where}", param=param, code="unsupported_parameter")
    return APIError(400, f"{param}: {msg}" if param else msg, param=param, code="invalid_value")


def install_handlers(app) -> None:
    """Registers exception handlers so that no route answers with FastAPI's default error shape."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return validation_error(exc.errors(), f"{request.method} {request.url.path}").response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        code = "request_too_large" if exc.status_code == 413 else None   # validation.BodyLimitMiddleware
        return APIError(exc.status_code, str(exc.detail), code=code, headers=exc.headers).response()


class CatchAllMiddleware:
    """Pure ASGI middleware for failures no exception handler answered (our bugs).

    Starlette's ServerErrorMiddleware sends its 500 and then re-raises, and uvicorn answers that by
    dropping the connection, so a keep-alive client's next request fails with a reset. Here the
    traceback is logged once (with the request id), the client gets a 500 envelope that says
    `Connection: close`, and the exception goes no further. Once the response has started (a
    broken stream) the exception is re-raised: uvicorn then closes the connection, which is how a
    truncated body must end."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def track(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, track)
        except SlowClient:
            raise   # not an error of ours: ObservabilityMiddleware counts it as a client that left
        except Exception as exc:  # noqa: BLE001 - the last line of defence
            request_id = scope.get("state", {}).get("request_id")
            log.error("unhandled error in %s %s request_id=%s", scope["method"], scope["path"], request_id,
                      exc_info=exc)
            if started:
                raise
            error = APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                             headers={"connection": "close"})
            await error.response()(scope, receive, send)
