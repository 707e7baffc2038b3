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

from omni_frontend.client_text import MAX_PARAM_CHARS, clipped, error_text
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
    invalid_unicode (a string holds a lone UTF-16 surrogate, as the HTTP routes refuse),
    invalid_value (the event does not match its SDK model with strict types; param names the field in
    the event's own notation, e.g. `item.content[0].audio`) or unknown_parameter (a field the model
    does not define)."""
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
        check(_CLIENT, event, event_id)
    elif not isinstance(event.get("session"), dict):
        raise ProtocolError("session.update needs a 'session' object", param="session", event_id=event_id)
    else:
        unknown = next((key for key in event if key not in ("type", "event_id", "session")), None)
        if unknown is not None:
            raise ProtocolError(f"unknown parameter '{unknown}'", code="unknown_parameter", param=unknown,
                                event_id=event_id)
        if event.get("event_id") is not None and event_id is None:
            raise ProtocolError("event_id: Input should be a valid string", param="event_id")
    return event


def check(schema, data: dict, event_id: str | None = None, prefix: str = "") -> None:
    """Validate `data` against an SDK model or TypeAdapter with strict types ("5" is not an integer, "yes"
    not a boolean: the value is used as sent, so it must already have the type) and no unknown fields.

    Raises ProtocolError: invalid_value (param = `prefix` + the field's path in `data`, e.g.
    `item.content[0].audio`) or unknown_parameter (a field the model does not define)."""
    try:
        validated = schema.validate_python(data, strict=True)
    except pydantic.ValidationError as exc:
        error = _intended_error(exc.errors(), data)
        param = prefix + field_path(data, error["loc"], error["type"] == "missing")
        raise ProtocolError(f"{param or 'event'}: {error['msg']}", param=param or None, event_id=event_id) from None
    unknown = _unknown_field(validated)
    if unknown:
        raise ProtocolError(f"unknown parameter '{prefix}{unknown}'", code="unknown_parameter",
                            param=prefix + unknown, event_id=event_id)


def field_path(data, loc: tuple, last_is_field: bool = False) -> str:
    """The path of pydantic error location `loc` in `data`, as the client wrote it (`audio.output.voice`,
    `item.content[0].type`): location parts that are not keys or indices of `data` (union branch names such
    as `ServerVad` or `str`) are left out; `last_is_field` keeps a last part absent from `data` (a missing field)."""
    node, path = data, ""
    for index, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node, path = node[part], f"{path}[{part}]"
            continue
        elif not (last_is_field and index == len(loc) - 1):
            continue
        path = f"{path}.{part}" if path else str(part)
    return path


def _intended_error(errors: list[dict], data) -> dict:
    """The error of the union branch the client meant. A smart union (client events, conversation items,
    audio formats, turn detection) reports every branch's errors; a branch whose `type` or `role` does not
    match the input (literal_error or missing right under the branch name) is another kind of object, so
    its errors are left out. When every branch is another kind, the closest one's mismatch is reported:
    `role` before `type` (the type matched), fewest mismatches first."""
    mismatches: dict[tuple, list[dict]] = {}
    for error in errors:
        loc = error["loc"]
        if error["type"] in ("literal_error", "missing") and loc and loc[-1] in ("type", "role") \
                and field_path(data, loc[:-1]) == field_path(data, loc[:-2]):  # the parent is a branch name
            mismatches.setdefault(loc[:-1], []).append(error)
    for error in errors:
        if not any(error["loc"][:len(branch)] == branch for branch in mismatches):
            return error
    closest = min(mismatches.values(), key=lambda found: (any(e["loc"][-1] == "type" for e in found), len(found)))[0]
    path = field_path(data, closest["loc"], True)
    expected = dict.fromkeys(e["ctx"]["expected"] for found in mismatches.values() for e in found
                             if e["type"] == "literal_error" and field_path(data, e["loc"], True) == path)
    if len(expected) > 1:  # every branch's value for the field, not only the closest one's
        return {**closest, "msg": f"Input should be one of {', '.join(expected)}"}
    return closest


def _unknown_field(model, path: str = "") -> str | None:
    """Path of the first field of a validated SDK model tree that its model does not define, or None."""
    if isinstance(model, list):
        return next((found for index, child in enumerate(model) if (found := _unknown_field(child, f"{path}[{index}]"))),
                    None)
    if not isinstance(model, pydantic.BaseModel):
        return None
    for name in model.model_extra or {}:
        return f"{path}.{name}" if path else name
    for name in model.model_fields_set:
        found = _unknown_field(getattr(model, name), f"{path}.{name}" if path else name)
        if found:
            return found
    return None


def encode(event: dict) -> str:
    """JSON text of one server event, after checking it against the SDK's server-event models."""
    event.setdefault("event_id", new_id("event"))
    if event["type"] not in _UNCHECKED:
        _SERVER.validate_python(event)
    return json.dumps(event)


def error_event(error: ProtocolError) -> dict:
    """The `error` server event for a rejected client event. Its message, param and event_id quote client input, so
    they are bounded as the HTTP routes' errors are (errors.APIError; an event_id of 1 MB is not echoed whole)."""
    message, param = error_text(error.message, error.param)
    return {"type": "error", "error": {"type": error.type, "code": error.code, "message": message, "param": param,
                                       "event_id": clipped(error.event_id, MAX_PARAM_CHARS)}}
