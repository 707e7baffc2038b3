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

from omni_frontend.chat_protocol import UNSUPPORTED_FIELDS
from omni_frontend.config import RequestLimits
from omni_frontend.realtime.protocol import ProtocolError, check
from omni_frontend.validation import LANGUAGE_CODE, refuse_unsupported

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
_SCHEMAS = {"realtime": pydantic.TypeAdapter(RealtimeSessionCreateRequest),
            "transcription": pydantic.TypeAdapter(RealtimeTranscriptionSessionCreateRequest)}
READ_ONLY = ("object", "id")  # set by the server (session.created); an update may echo them, they are kept
_NO_TOOLS, _NO_LOGPROBS = UNSUPPORTED_FIELDS["tools"][1], UNSUPPORTED_FIELDS["logprobs"][1]
_NO_TOOL_CHOICE = ("auto", "none")  # with no tools, the model calls none either way
# Fields that would change the answer's contract and that this server does not honour: path in the session or
# response object -> (values that change nothing, why). Any other value is refused naming the field, as chat
# refuses the same features (chat_protocol.UNSUPPORTED_FIELDS, the same walker: validation.refuse_unsupported),
# never silently dropped.
SESSION_UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "tools": ((None, []), _NO_TOOLS),
    "tool_choice": ((None, *_NO_TOOL_CHOICE), _NO_TOOLS),
    "include": ((None, []), _NO_LOGPROBS),
    "prompt": ((None,), "stored prompts are not used"),
    "truncation": ((None, "auto"), "the oldest items are left out beyond a fixed history length"),
    "audio.input.noise_reduction": ((None, {}), "the input audio is not denoised"),
    "audio.input.transcription.keywords": ((None, [], ""), "keyword biasing is not supported (use prompt)"),
    "audio.input.transcription.languages": ((None, []), "language sets are not supported (use language)"),
}
RESPONSE_UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "input": ((None,), "a response answers the conversation"),
    "tools": ((None, []), _NO_TOOLS),
    "tool_choice": ((None, *_NO_TOOL_CHOICE), _NO_TOOLS),
    "prompt": ((None,), "stored prompts are not used"),
}


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
    automatic turn taking; transcribe: emit input transcription events; max_tokens: the most output tokens
    of a response, None for "inf" (the documented maximum, MAX_OUTPUT_TOKENS: `effective_max_tokens`).
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
                            param=f"{param}.rate" if kind == "audio/pcm" else f"{param}.type")
    return "pcm", rate


def format_wire(fmt: str, rate: int) -> dict:
    """The OpenAI format object of a (format, rate) pair as _format returns it: {"type": "audio/pcm", "rate"} or
    {"type": "audio/pcmu"} / {"type": "audio/pcma"}."""
    return {"type": "audio/pcm", "rate": rate} if fmt == "pcm" else {"type": f"audio/{fmt}"}


def _schema_copy(session: dict) -> dict:
    """The session with PCM rates set to 24000 (the SDK schema knows no other) for schema validation."""
    checked = copy.deepcopy(session)
    for side in ("input", "output"):
        spec = ((checked.get("audio") or {}).get(side) or {}).get("format")
        if isinstance(spec, dict) and spec.get("type", "audio/pcm") == "audio/pcm" and "rate" in spec:
            spec["rate"] = 24000
    return checked


def validate(session: dict, event_id: str | None = None,
             max_text_chars: int = RequestLimits.max_text_chars) -> SessionSettings:
    """Effective settings of a merged session. Raises ProtocolError (param = the field, prefixed
    "session.") for anything the SDK schema (strict types, no unknown fields) or this server does not
    accept, including a transcription prompt over `max_text_chars` (--max-text-chars). The voice is checked
    by the session against its pipeline (`RealtimeSession._check_voice`)."""
    kind = session.get("type", "realtime")
    if kind not in _SCHEMAS:
        raise ProtocolError(f"session.type must be 'realtime' or 'transcription', got {kind!r}", param="session.type",
                            event_id=event_id)
    checked = _schema_copy(session)
    for key in READ_ONLY:
        checked.pop(key, None)
    check(_SCHEMAS[kind], checked, event_id, prefix="session.")
    try:
        return _settings(session, kind, max_text_chars)
    except ProtocolError as exc:
        exc.event_id = event_id
        if exc.param and not exc.param.startswith("session."):
            exc.param = f"session.{exc.param}"
        raise


def _settings(session: dict, kind: str, max_text_chars: int) -> SessionSettings:
    audio = session.get("audio") or {}
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    input_format, input_rate = _format(audio_in.get("format"), INPUT_PCM_RATES, "audio.input.format")
    output_format, output_rate = _format(audio_out.get("format"), (OUTPUT_PCM_RATE,), "audio.output.format")
    transcription = audio_in.get("transcription")
    refuse_unsupported(session, SESSION_UNSUPPORTED, unsupported_feature("session."))
    prompt = (transcription or {}).get("prompt")
    check_length(prompt, "audio.input.transcription.prompt", max_text_chars)
    language = (transcription or {}).get("language")
    if language is not None and not LANGUAGE_CODE.fullmatch(language):
        raise ProtocolError(f"audio.input.transcription.language must be an ISO-639-1 code such as 'en', got {language!r}",
                            param="audio.input.transcription.language")
    if audio_out.get("speed") not in (None, 1, 1.0):
        raise ProtocolError("audio.output.speed other than 1.0 is not supported by the voice pipeline",
                            code="unsupported_feature", param="audio.output.speed")
    vad, create, interrupt = _turn_detection(audio_in.get("turn_detection"))
    return SessionSettings(
        kind=kind, instructions=session.get("instructions") or "",
        audio_out=_audio_out(session.get("output_modalities"), True, "output_modalities"),
        voice=voice_name(audio_out.get("voice"), "audio.output.voice") or DEFAULT_VOICE,
        input_format=input_format, input_rate=input_rate, output_format=output_format, output_rate=output_rate,
        vad=vad, create_response=create and kind == "realtime", interrupt_response=interrupt and kind == "realtime",
        transcribe=transcription is not None or kind == "transcription",
        transcription_language=(transcription or {}).get("language") or "en",
        transcription_prompt=prompt,
        max_tokens=_max_tokens(session.get("max_output_tokens"), None, "max_output_tokens"))


def unsupported_feature(prefix: str):
    """The realtime error for a field that validation.refuse_unsupported refuses in a session or response object
    (SESSION_UNSUPPORTED / RESPONSE_UNSUPPORTED): a factory of ProtocolError code `unsupported_feature`, param
    `prefix` + the field's path (e.g. "session.tools")."""
    def error(path: str, why: str) -> ProtocolError:
        return ProtocolError(f"{prefix}{path} is not supported by this server: {why}", code="unsupported_feature",
                             param=prefix + path)
    return error


def check_length(text: str | None, param: str, max_text_chars: int) -> None:
    """Raises ProtocolError (`param`) for a client's text over `max_text_chars` (--max-text-chars): a
    transcription prompt (every turn's transcription tokenizes it whole) or instructions (the LLM stage's
    system message, refused there only when a response runs). The server's DEFAULT_INSTRUCTIONS are not
    the client's, so `session.update` checks the instructions it sets (RealtimeSession, once `validate` has
    checked their type), not `validate`."""
    if text is not None and len(text) > max_text_chars:
        raise ProtocolError(f"{param} is {len(text)} characters; the limit is {max_text_chars} (--max-text-chars)",
                            param=param)


def voice_name(voice: str | dict | None, param: str) -> str | None:
    """The voice id of an `audio.output.voice` value (a name, or a custom voice `{"id": ...}`); None when it
    is not given. Raises ProtocolError (`param`) for an empty name, as chat's `audio.voice` and
    /v1/audio/speech's `voice` refuse it (it used to be echoed back as the session's voice and ignored)."""
    name = voice.get("id") if isinstance(voice, dict) else voice
    if name is not None and not name.strip():
        raise ProtocolError("the voice must not be empty", param=param)
    return name


def _audio_out(modalities: list[str] | None, default: bool, param: str) -> bool:
    """Whether a response speaks: output_modalities is ["audio"] or ["text"] (OpenAI: "It is not possible to
    request both text and audio at the same time"; both were served as audio); None keeps `default`. Raises
    ProtocolError (invalid_value) for anything else."""
    if modalities is None:
        return default
    if modalities not in (["audio"], ["text"]):
        raise ProtocolError(f"{param} must be ['audio'] or ['text'] (one of them: a response speaks or writes), "
                            f"got {modalities!r}", param=param, code="invalid_value")
    return modalities == ["audio"]


def effective_max_tokens(max_tokens: int | None) -> int:
    """The max_tokens a response sends to the pipeline: `max_tokens` (1-MAX_OUTPUT_TOKENS), or MAX_OUTPUT_TOKENS for
    None ("inf"), never the pipeline's own default (256 for voice), which would cut an "inf" answer short."""
    return MAX_OUTPUT_TOKENS if max_tokens is None else max_tokens


def _max_tokens(tokens: int | str | None, default: int | None, param: str) -> int | None:
    """None for "inf"; `default` when not given. Raises ProtocolError outside [1, MAX_OUTPUT_TOKENS]."""
    if tokens is None:
        return default
    if tokens != "inf" and not 1 <= tokens <= MAX_OUTPUT_TOKENS:
        raise ProtocolError(f"{param} must be 'inf' or an integer in [1, {MAX_OUTPUT_TOKENS}], got {tokens}", param=param)
    return None if tokens == "inf" else tokens


@dataclasses.dataclass(frozen=True)
class ResponseSettings:
    """What one response does: a `response.create` event's `response` object over the session's settings.
    voice: the voice id (checked against the pipeline by the session); in_conversation: False for
    `conversation: "none"` (out of band); output_format / output_rate as in SessionSettings."""

    audio_out: bool
    voice: str
    instructions: str
    max_tokens: int | None
    in_conversation: bool
    output_format: str
    output_rate: int


def response_settings(spec: dict, session: SessionSettings,
                      max_text_chars: int = RequestLimits.max_text_chars) -> ResponseSettings:
    """Settings of a `response.create` event's `response` (already checked against the SDK's
    RealtimeResponseCreateParams: strict types, no unknown fields). Raises ProtocolError (param
    "response.<field>") for a value this server does not accept, before anything runs, including
    `instructions` over `max_text_chars` (--max-text-chars)."""
    refuse_unsupported(spec, RESPONSE_UNSUPPORTED, unsupported_feature("response."))
    check_length(spec.get("instructions"), "response.instructions", max_text_chars)
    conversation = spec.get("conversation")
    if conversation not in (None, "auto", "none"):
        raise ProtocolError(f"response.conversation must be 'auto' or 'none', got {conversation!r}",
                            param="response.conversation")
    audio_out = (spec.get("audio") or {}).get("output") or {}
    output_format, output_rate = ((session.output_format, session.output_rate) if audio_out.get("format") is None else
                                  _format(audio_out["format"], (OUTPUT_PCM_RATE,), "response.audio.output.format"))
    return ResponseSettings(
        audio_out=_audio_out(spec.get("output_modalities"), session.audio_out, "response.output_modalities"),
        voice=voice_name(audio_out.get("voice"), "response.audio.output.voice") or session.voice, instructions=spec.get("instructions") or session.instructions,
        max_tokens=_max_tokens(spec.get("max_output_tokens"), session.max_tokens, "response.max_output_tokens"),
        in_conversation=conversation != "none", output_format=output_format, output_rate=output_rate)


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
