"""Realtime session configuration: OpenAI GA defaults, `session.update` deep merge, validation.

The session is kept as the JSON object the client sees (`session.created` / `session.updated` send it).
`merge` applies an update the way OpenAI documents it: nested objects merge key by key (a partial
`turn_detection` keeps its other fields), an explicit `null` clears a field (`turn_detection: null`
turns VAD off), and an object whose `type` changes (`audio/pcm` -> `audio/pcmu`, `server_vad` ->
`semantic_vad`) replaces the old one. `validate` checks the result with the SDK's
`RealtimeSessionCreateRequest` / `RealtimeTranscriptionSessionCreateRequest` plus what this server
supports, and returns the effective `SessionSettings`.
"""
from __future__ import annotations

import copy
import dataclasses

import pydantic
from openai.types.realtime import RealtimeSessionCreateRequest, RealtimeTranscriptionSessionCreateRequest

from omni_frontend.realtime.protocol import ProtocolError, validation_error

INPUT_PCM_RATES = (24000, 16000, 8000)
G711_RATE = 8000
OUTPUT_PCM_RATE = 24000
DEFAULT_INSTRUCTIONS = "You are a helpful voice assistant. Answer in one or two short, friendly sentences."
DEFAULT_VOICE = "alloy"
DEFAULT_TRANSCRIPTION = {"model": "whisper-1", "language": "en", "prompt": None}
SERVER_VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
              "create_response": True, "interrupt_response": True, "idle_timeout_ms": None}
# semantic_vad is served by the same Silero VAD; eagerness picks how long a pause ends the turn.
SEMANTIC_SILENCE_MS = {"low": 1000, "medium": 500, "auto": 500, "high": 250}
MAX_OUTPUT_TOKENS = 4096
_SCHEMAS = {"realtime": RealtimeSessionCreateRequest, "transcription": RealtimeTranscriptionSessionCreateRequest}


def default_session(model: str, session_id: str) -> dict:
    """The session a new connection gets (type realtime; server VAD on; transcripts of user audio on)."""
    return {"type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "output_modalities": ["audio"], "instructions": DEFAULT_INSTRUCTIONS, "max_output_tokens": "inf",
            "tools": [], "tool_choice": "auto", "tracing": None, "truncation": "auto", "prompt": None,
            "include": None,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": None,
                                "transcription": dict(DEFAULT_TRANSCRIPTION), "turn_detection": dict(SERVER_VAD)},
                      "output": {"format": {"type": "audio/pcm", "rate": OUTPUT_PCM_RATE}, "voice": DEFAULT_VOICE,
                                 "speed": 1.0}}}


def merge(base: dict, update: dict) -> dict:
    """A deep-merged copy of `base` with `update` applied (rules in the module docstring)."""
    merged = copy.deepcopy(base)
    for key, value in update.items():
        old = merged.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and value.get("type", old.get("type")) == old.get("type"):
            merged[key] = merge(old, value)
        elif isinstance(value, dict) and key == "turn_detection" and value.get("type") == "server_vad":
            merged[key] = {**SERVER_VAD, **value}  # VAD switched (back) on: unspecified fields get defaults
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    """What the session does, read from a validated session object.

    kind: "realtime" | "transcription"; input_format / output_format: "pcm" | "pcmu" | "pcma";
    input_rate / output_rate: Hz of the client's audio; vad: None (commit by hand) or
    {"threshold", "prefix_padding_ms", "silence_duration_ms"}; create_response / interrupt_response:
    automatic turn taking; transcribe: emit input transcription events; max_tokens: None = pipeline default.
    """

    kind: str
    instructions: str
    audio_out: bool
    voice: str
    input_format: str
    input_rate: int
    output_format: str
    output_rate: int
    vad: dict | None
    create_response: bool
    interrupt_response: bool
    transcribe: bool
    transcription_language: str | None
    transcription_prompt: str | None
    max_tokens: int | None


def _format(spec: dict | None, rates: tuple[int, ...], param: str) -> tuple[str, int]:
    spec = spec or {"type": "audio/pcm"}
    kind = spec.get("type", "audio/pcm")
    if kind in ("audio/pcmu", "audio/pcma"):
        return kind[-4:], G711_RATE
    rate = spec.get("rate", 24000)
    if kind != "audio/pcm" or rate not in rates:
        raise ProtocolError(f"{param}: unsupported audio format {spec!r}; supported: audio/pcm at "
                            f"{' / '.join(map(str, rates))} Hz, audio/pcmu, audio/pcma", code="unsupported_audio_format",
                            param=param)
    return "pcm", rate


def _schema_copy(session: dict) -> dict:
    """The session with PCM rates set to 24000 (the SDK schema knows no other) for schema validation."""
    checked = copy.deepcopy(session)
    for side in ("input", "output"):
        spec = ((checked.get("audio") or {}).get(side) or {}).get("format")
        if isinstance(spec, dict) and spec.get("type", "audio/pcm") == "audio/pcm" and "rate" in spec:
            spec["rate"] = 24000
    return checked


def validate(session: dict, event_id: str | None = None) -> SessionSettings:
    """Effective settings of a merged session. Raises ProtocolError (param = the field, prefixed
    "session.") for anything the SDK schema or this server does not accept."""
    kind = session.get("type", "realtime")
    if kind not in _SCHEMAS:
        raise ProtocolError(f"session.type must be 'realtime' or 'transcription', got {kind!r}", param="session.type",
                            event_id=event_id)
    try:
        _SCHEMAS[kind].model_validate(_schema_copy(session))
        return _settings(session, kind)
    except pydantic.ValidationError as exc:
        raise validation_error(exc, event_id, prefix="session.") from None
    except ProtocolError as exc:
        exc.event_id = event_id
        if exc.param and not exc.param.startswith("session."):
            exc.param = f"session.{exc.param}"
        raise


def _settings(session: dict, kind: str) -> SessionSettings:
    audio = session.get("audio") or {}
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    input_format, input_rate = _format(audio_in.get("format"), INPUT_PCM_RATES, "audio.input.format")
    output_format, output_rate = _format(audio_out.get("format"), (OUTPUT_PCM_RATE,), "audio.output.format")
    for name, value, default in (("tools", session.get("tools"), []), ("prompt", session.get("prompt"), None),
                                 ("audio.input.noise_reduction", audio_in.get("noise_reduction"), None)):
        if value not in (default, None):
            raise ProtocolError(f"{name} is not supported by this server", code="unsupported_feature", param=name)
    if audio_out.get("speed") not in (None, 1, 1.0):
        raise ProtocolError("audio.output.speed other than 1.0 is not supported by the voice pipeline",
                            code="unsupported_feature", param="audio.output.speed")
    vad, create, interrupt = _turn_detection(audio_in.get("turn_detection"))
    modalities = session.get("output_modalities") or ["audio"]
    if not modalities:
        raise ProtocolError("output_modalities must not be empty", param="output_modalities")
    tokens = session.get("max_output_tokens", "inf")
    if tokens not in ("inf", None) and not (isinstance(tokens, int) and 1 <= tokens <= MAX_OUTPUT_TOKENS):
        raise ProtocolError(f"max_output_tokens must be 'inf' or an integer in [1, {MAX_OUTPUT_TOKENS}]",
                            param="max_output_tokens")
    transcription = audio_in.get("transcription")
    voice = audio_out.get("voice") or DEFAULT_VOICE
    return SessionSettings(
        kind=kind, instructions=session.get("instructions") or "", audio_out="audio" in modalities,
        voice=voice if isinstance(voice, str) else voice.get("id", DEFAULT_VOICE),
        input_format=input_format, input_rate=input_rate, output_format=output_format, output_rate=output_rate,
        vad=vad, create_response=create and kind == "realtime", interrupt_response=interrupt and kind == "realtime",
        transcribe=transcription is not None or kind == "transcription",
        transcription_language=(transcription or {}).get("language") or "en",
        transcription_prompt=(transcription or {}).get("prompt"),
        max_tokens=None if tokens in ("inf", None) else tokens)


def _turn_detection(spec: dict | None) -> tuple[dict | None, bool, bool]:
    """(VAD options for voice_vad or None, create_response, interrupt_response)."""
    if spec is None:
        return None, False, False
    if spec.get("idle_timeout_ms") is not None:
        raise ProtocolError("turn_detection.idle_timeout_ms is not supported by this server", code="unsupported_feature",
                            param="audio.input.turn_detection.idle_timeout_ms")
    if spec["type"] == "semantic_vad":
        options = {"threshold": SERVER_VAD["threshold"], "prefix_padding_ms": SERVER_VAD["prefix_padding_ms"],
                   "silence_duration_ms": SEMANTIC_SILENCE_MS[spec.get("eagerness") or "auto"]}
    else:
        options = {key: spec.get(key, SERVER_VAD[key]) if spec.get(key) is not None else SERVER_VAD[key]
                   for key in ("threshold", "prefix_padding_ms", "silence_duration_ms")}
    if not 0.0 <= options["threshold"] <= 1.0:
        raise ProtocolError("turn_detection.threshold must be in [0, 1]", param="audio.input.turn_detection.threshold")
    for key in ("prefix_padding_ms", "silence_duration_ms"):
        if not 0 <= options[key] <= 60_000:
            raise ProtocolError(f"turn_detection.{key} must be in [0, 60000]", param=f"audio.input.turn_detection.{key}")
    create = spec.get("create_response")
    interrupt = spec.get("interrupt_response")
    return options, create is None or bool(create), interrupt is None or bool(interrupt)
