"""The Realtime wire codec: client events parsed, server events checked, with the `openai` package's
`openai.types.realtime` pydantic models (GA event names only: what current SDKs parse).

Server events are plain dicts sent as JSON; `encode` validates each one against the SDK's
`RealtimeServerEvent` union first, so a field the SDK would not parse is our bug and fails loudly.
Session objects are checked separately (`omni_frontend.realtime.config`): we accept input PCM at 16 and
8 kHz, which the SDK's `AudioPCM` literal (24000 only) does not describe.
"""
from __future__ import annotations

import json
import uuid

import pydantic
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent

from omni_frontend.validation import invalid_text

_CLIENT = pydantic.TypeAdapter(RealtimeClientEvent)
_SERVER = pydantic.TypeAdapter(RealtimeServerEvent)
CLIENT_EVENT_TYPES = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                      "input_audio_buffer.clear", "conversation.item.create", "conversation.item.retrieve",
                      "conversation.item.truncate", "conversation.item.delete", "response.create",
                      "response.cancel", "output_audio_buffer.clear")
_UNCHECKED = ("session.created", "session.updated")  # validated as sessions by config.validate


class ProtocolError(Exception):
    """A client event we reject: becomes an `error` server event (the session goes on).

    code: machine-readable reason (e.g. "invalid_json", "input_audio_buffer_commit_empty");
    param: the offending field; event_id: the client event's id when it had one."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 event_id: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.code, self.param, self.event_id, self.type = message, code, param, event_id, type


def new_id(prefix: str) -> str:
    """An id like OpenAI's: `event_…`, `item_…`, `resp_…`, `sess_…` (prefix + 20 hex characters)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def decode(text: str | bytes) -> dict:
    """Parse one client WebSocket message into the event dict (as sent, for lossless session merges).

    Raises ProtocolError: invalid_json, unknown_event (a type that is not a GA client event),
    invalid_unicode (a string holds a lone UTF-16 surrogate, as the HTTP routes refuse), or
    invalid_value (the event does not match its SDK model; param names the field)."""
    try:
        event = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"message is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(event, dict):
        raise ProtocolError("a client event must be a JSON object", code="invalid_json")
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    kind = event.get("type")
    if kind not in CLIENT_EVENT_TYPES:
        raise ProtocolError(f"unknown client event type {kind!r}; supported: {', '.join(CLIENT_EVENT_TYPES)}",
                            code="unknown_event", param="type", event_id=event_id)
    found = invalid_text(event)
    if found:
        raise ProtocolError(f"{found[0]} is not valid Unicode: it holds a lone UTF-16 surrogate at character "
                            f"{found[1]}", code="invalid_unicode", param=found[0], event_id=event_id)
    if kind != "session.update":  # sessions are merged first, then validated whole (config.validate)
        try:
            _CLIENT.validate_python(event)
        except pydantic.ValidationError as exc:
            raise validation_error(exc, event_id, skip=1) from None
    elif not isinstance(event.get("session"), dict):
        raise ProtocolError("session.update needs a 'session' object", param="session", event_id=event_id)
    return event


def validation_error(exc: pydantic.ValidationError, event_id: str | None, skip: int = 0, prefix: str = "") -> ProtocolError:
    """The first pydantic error as a ProtocolError whose param is the dotted field path (union-branch
    names dropped; `skip` leading path parts dropped)."""
    first = exc.errors()[0]
    loc = [str(p) for p in first["loc"][skip:] if not (isinstance(p, str) and (p[:1].isupper() or "[" in p))]
    param = prefix + ".".join(loc)
    return ProtocolError(f"{param or 'event'}: {first['msg']}", param=param or None, event_id=event_id)


def encode(event: dict) -> str:
    """JSON text of one server event, after checking it against the SDK's server-event models."""
    event.setdefault("event_id", new_id("event"))
    if event["type"] not in _UNCHECKED:
        _SERVER.validate_python(event)
    return json.dumps(event)


def error_event(error: ProtocolError) -> dict:
    """The `error` server event for a rejected client event."""
    return {"type": "error", "error": {"type": error.type, "code": error.code, "message": error.message,
                                       "param": error.param, "event_id": error.event_id}}
