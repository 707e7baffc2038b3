"""uvicorn's httptools protocol with a deadline for each request head and for each pause in a request body.

uvicorn closes a kept-alive connection that stays silent for `timeout_keep_alive` (5 s), but a connection that
sends nothing after connecting, or only part of a request head (slowloris), it holds for good: each holds a socket
and a file descriptor of the frontend's ~20k, and enough of them make it refuse every client (EMFILE). Here a
connection must deliver each request head (request line and headers, also a WebSocket upgrade's) within
`head_timeout_s` (the launcher's --http-head-timeout, 30 s) of the connection opening or of the request's first
byte, as nginx's `client_header_timeout`; otherwise it is closed. A request body may take longer, but it must not
stall: a connection that sends no part of its body for `body_idle_timeout_s` (60 s) while the server reads is
closed too, as nginx's `client_body_timeout` (a head followed by part of a body held its connection for good).
Responses and open WebSockets have no such deadline (their own timeouts apply: `RequestLimits.send_timeout_s`).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

BODY_IDLE_TIMEOUT_S = 60.0


def with_head_timeout(head_timeout_s: float, body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S) -> type[HttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`: HttpToolsProtocol that closes a connection whose request
    head does not arrive within head_timeout_s seconds, or whose request body stops for body_idle_timeout_s seconds.
    Raises ValueError unless both are > 0."""
    if not head_timeout_s > 0:
        raise ValueError(f"the request head timeout must be > 0 seconds, got {head_timeout_s}")
    if not body_idle_timeout_s > 0:
        raise ValueError(f"the request body timeout must be > 0 seconds, got {body_idle_timeout_s}")

    class HeadTimeoutProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _arm_body(self) -> None:
            self._disarm_body()
            self._body_timer = self.loop.call_later(body_idle_timeout_s, self._body_timed_out)

        def _disarm_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if self.flow is not None and self.flow.read_paused:   # the server is not reading: not the client's stall
                self._arm_body()
            elif not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:   # the first byte of the next request on this connection
            self._arm()
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            if not self.parser.should_upgrade():   # its body (if any) follows; on_message_complete ends it
                self._arm_body()

        def on_body(self, body: bytes) -> None:
            self._arm_body()
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm_body()
            super().on_message_complete()

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._disarm_body()
            super().connection_lost(exc)

    return HeadTimeoutProtocol
