"""Request errors that pipelines raise for bad input; adapters turn them into Triton error responses
carrying the OpenAI error envelope (the frontend maps them back to HTTP 4xx)."""
from __future__ import annotations

import json


class RequestError(ValueError):
    """Bad input from the client: message for the user, the offending field, HTTP status (default 400)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def envelope(self) -> str:
        """JSON `{"error": {"message", "type", "param", "code", "status"}}` for a Triton error message."""
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return json.dumps({"error": {"message": self.message, "type": kind, "param": self.param,
                                     "code": self.code, "status": self.status}})
