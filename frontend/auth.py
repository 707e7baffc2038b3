"""The API key check shared by the HTTP routes (`app.BearerAuthMiddleware`) and the WebSocket routes (realtime,
speech stream), which check it themselves."""
from __future__ import annotations

import hmac


def bearer_matches(authorization: str | bytes, api_key: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <api_key>`: the scheme name in any case (RFC 9110),
    blanks around the key ignored, the key compared in constant time. Missing or empty: False."""
    value = authorization.encode() if isinstance(authorization, str) else authorization
    scheme, _, token = value.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), api_key.encode())


KEY_PROTOCOL = "openai-insecure-api-key."   # a browser's WebSocket subprotocol carrying the key


def offered_subprotocols(websocket) -> list[str]:
    """The subprotocols a WebSocket client offered (its Sec-WebSocket-Protocol header), in order."""
    return [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]


def websocket_authorized(websocket, api_key: str | None, protocols: list[str]) -> bool:
    """Whether a WebSocket client may connect: no key configured, or `Authorization: Bearer KEY` (SDKs), or the
    subprotocol `openai-insecure-api-key.KEY` among the offered `protocols` (browsers cannot set headers)."""
    if not api_key:
        return True
    offered = [websocket.headers.get("authorization", "")] + [f"Bearer {p[len(KEY_PROTOCOL):]}" for p in protocols
                                                              if p.startswith(KEY_PROTOCOL)]
    return any(bearer_matches(o, api_key) for o in offered)


def accepted_subprotocol(protocols: list[str], supported: tuple[str, ...] = ()) -> str | None:
    """The subprotocol a WebSocket handshake answers with: the first of `supported` the client offered, else its
    key protocol (`openai-insecure-api-key.KEY`), else None. A browser that offered protocols fails a handshake
    that names none of them."""
    return next((p for p in protocols if p in supported), None) or next(
        (p for p in protocols if p.startswith(KEY_PROTOCOL)), None)
