"""Errors that reach the client: adapters turn them into Triton error responses carrying the OpenAI
error envelope (the frontend maps them back to that HTTP status)."""
from __future__ import annotations

import json

_TYPES = {404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}
# The code of a speech pipeline's 400 for text it says nothing of (the speech WebSocket makes that sentence silence)
NOTHING_TO_SPEAK = "nothing_to_speak"


class RequestError(ValueError):
    """An error for the client: message for the user, the offending field, HTTP status (default 400,
    bad input; 503 for `unavailable`)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def envelope(self) -> str:
        """JSON `{"error": {"message", "type", "param", "code", "status"}}` for a Triton error message."""
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return json.dumps({"error": {"message": self.message, "type": kind, "param": self.param,
                                     "code": self.code, "status": self.status}})


def unavailable(message: str, code: str = "model_unavailable") -> RequestError:
    """A retryable server-side failure (HTTP 503), e.g. an engine loop that restarts after a crash."""
    return RequestError(message, code=code, status=503)
