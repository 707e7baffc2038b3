"""The API key check shared by the HTTP routes (`app.BearerAuthMiddleware`) and the realtime WebSocket."""
from __future__ import annotations

import hmac


def bearer_matches(authorization: str | bytes, api_key: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <api_key>`: the scheme name in any case (RFC 9110),
    blanks around the key ignored, the key compared in constant time. Missing or empty: False."""
    value = authorization.encode() if isinstance(authorization, str) else authorization
    scheme, _, token = value.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), api_key.encode())
