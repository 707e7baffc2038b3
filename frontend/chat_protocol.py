"""OpenAI chat-completions request validation and its mapping onto a chat pipeline's REQUEST.

Pipeline REQUEST JSON (what any Triton client sends to a chat pipeline such as `voice` or
`qwen3_omni`):
  {"messages": [{"role": "system"|"user"|"assistant", "content": [
        {"type": "text", "text": str} |
        {"type": "input_audio", "offset": int, "samples": int, "sample_rate": 16000} |
        {"type": "image"}]}],
   "modalities": ["text"] | ["audio"] | ["text", "audio"], "voice": str | null,
   "temperature", "top_p", "top_k", "max_tokens", "seed", "presence_penalty", "frequency_penalty",
   "repetition_penalty", "stop": [str]}
Input audio travels as float32 mono 16 kHz samples in the INPUT_AUDIO tensor [total_samples];
each input_audio part points at its slice (offset, samples). Images (pipelines whose `content` has image_url) travel
as INPUT_IMAGES uint8 [K, H, W, 3] + INPUT_IMAGE_SIZES int32 [K, 2] (`chat_images`); the k-th image part is image k.
"""
from __future__ import annotations

import base64
import binascii
from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from omni_frontend import audio as audio_codec
from omni_frontend import chat_images, pipeline_stream
from omni_frontend.config import RequestLimits
from omni_frontend.errors import APIError, bad_request
from omni_frontend.validation import RequestModel, refuse_unsupported

INPUT_SAMPLE_RATE = 16000
AudioFormat = Literal["wav", "pcm16", "flac", "mp3", "opus", "aac"]
MAX_STOP_SEQUENCES = 16

# OpenAI request fields that would change the contract of the answer and that no pipeline honours:
# field -> (values that change nothing, why). Any other value is a 400 naming the field, never a
# silently different answer.
UNSUPPORTED_FIELDS: dict[str, tuple[tuple, str]] = {
    "tools": ((None, []), "the served models do not call tools"),
    "tool_choice": ((None, "none"), "the served models do not call tools"),
    "functions": ((None, []), "the served models do not call functions"),
    "function_call": ((None, "none"), "the served models do not call functions"),
    "parallel_tool_calls": ((None,), "it applies to tools, which the served models do not call"),
    "response_format": ((None, {"type": "text"}), "structured outputs (json_object, json_schema) are not "
                                                  "generated; only {\"type\": \"text\"}"),
    "logprobs": ((None, False), "log probabilities are not returned"),
    "top_logprobs": ((None,), "log probabilities are not returned"),
    "logit_bias": ((None, {}), "the samplers take no logit bias"),
    "prediction": ((None,), "predicted outputs are not used"),
    "reasoning_effort": ((None,), "no served model reasons"),
    "verbosity": ((None,), "the served models take no verbosity setting"),
    "web_search_options": ((None,), "the server does not search the web"),
    "moderation": ((None,), "the server does not moderate"),
}
# OpenAI fields accepted and not passed on: they do not change the answer.
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
                  "prompt_cache_retention", "prompt_cache_options")
# The pipeline REQUEST keys `to_pipeline` fills from the route's own fields: an extension field of the same name
# would be overwritten, so it is refused (routes.common.refuse_unread_fields).
# `prompt` too: a completion's raw prompt (omni_frontend.completions_protocol), which must not bypass the chat template.
ROUTED_KEYS = ("messages", "prompt", "modalities", "voice", "temperature", "top_p", "top_k", "max_tokens", "seed",
               "stop", "presence_penalty", "frequency_penalty", "repetition_penalty")
# Message fields that refer to earlier tool calls or stored audio: not supported.
UNSUPPORTED_MESSAGE_FIELDS = {"tool_calls": "the served models do not call tools",
                              "function_call": "the served models do not call functions",
                              "audio": "references to earlier audio answers are not stored; send the transcript "
                                       "as the assistant message's content"}

# The OpenAPI schema of message content (runtime validation is done by to_pipeline, which names
# the offending part in its errors).
_CONTENT_SCHEMA = {"anyOf": [
    {"type": "string"},
    {"type": "array", "items": {"anyOf": [
        {"type": "object", "required": ["type", "text"], "properties": {
            "type": {"const": "text"}, "text": {"type": "string"}}},
        {"type": "object", "required": ["type", "input_audio"], "properties": {
            "type": {"const": "input_audio"},
            "input_audio": {"type": "object", "required": ["data"], "properties": {
                "data": {"type": "string", "description": "base64 audio file (wav, mp3, flac, ogg, ...)"},
                "format": {"type": "string"}}}}},
        {"type": "object", "required": ["type", "image_url"], "properties": {
            "type": {"const": "image_url"},
            "image_url": {"type": "object", "required": ["url"], "properties": {
                "url": {"type": "string", "description": "data:image/...;base64,... or an http(s) URL"},
                "detail": {"type": "string"}}}}}]}},
    {"type": "null"}]}


def _voice_id(voice):
    # omni_frontend.realtime.config imports this module: its voice_name is imported when first used
    from omni_frontend.realtime.config import voice_name
    from omni_frontend.realtime.protocol import ProtocolError

    if not (isinstance(voice, str) or isinstance(voice, dict) and voice.keys() == {"id"}
            and isinstance(voice["id"], str)):
        raise ValueError("the voice must be a name or a custom voice object {\"id\": name}")
    try:
        return voice_name(voice, "voice")
    except ProtocolError as exc:
        raise ValueError(exc.message) from None


# A request's voice: a name, or OpenAI's custom voice object {"id": name}, resolved to the name as a realtime
# session resolves `audio.output.voice` (omni_frontend.realtime.config.voice_name); the pipeline then refuses
# a name it does not have (400 naming the voice, listing its voices). An empty name is a 400.
Voice = Annotated[str, BeforeValidator(_voice_id), WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}]})]


class AudioParams(RequestModel):
    """Chat's `audio` object, validated as strictly as /v1/audio/speech: a non-empty voice (`Voice`: a name or
    {"id": name}; the pipeline rejects names it does not have), a known format, no other keys."""

    model_config = ConfigDict(extra="forbid", strict=True)
    voice: Voice
    format: AudioFormat = "wav"


class StreamOptions(RequestModel):
    model_config = ConfigDict(strict=True)  # nested models keep their own config: strict as ChatRequest
    include_usage: bool = False


class Message(RequestModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[str | list[dict] | None, WithJsonSchema(_CONTENT_SCHEMA)] = None


class GenerationFields(RequestModel):
    """The sampling and streaming fields of the text-generating requests (ChatRequest, and /v1/completions'
    completions_protocol.CompletionRequest), as the chat pipeline REQUEST takes them."""

    model_config = ConfigDict(extra="allow", strict=True)  # "10" is not an integer, "yes" not a boolean
    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = Field(default=None, ge=-2**63, le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)  # vLLM's extension
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatRequest(GenerationFields):
    """The OpenAI request fields we honour; unknown fields (extra_body) are passed to the pipeline, and
    the route refuses those it does not read before admission (a 400 naming the field;
    routes.common.refuse_unread_fields).
    Contract-changing OpenAI fields that nothing honours (UNSUPPORTED_FIELDS) and `n` > 1 are rejected
    by `to_pipeline`."""

    messages: list[Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParams | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1, le=1, description="only 1 is supported")

    @field_validator("modalities")
    @classmethod
    def _non_empty(cls, value):
        if value is not None and not value:
            raise ValueError("modalities must not be empty")
        return value

    def output_modalities(self) -> list[str]:
        """Both text and audio unless asked otherwise (vLLM-Omni's default for omni models)."""
        return list(dict.fromkeys(self.modalities or ["text", "audio"]))


class ChatBatchRequest(ChatRequest):
    """POST /v1/chat/completions/batch (vLLM's batch chat): `messages` is a list of conversations (1..MAX), each
    as ChatRequest's `messages`; every other field is ChatRequest's, applied to each conversation."""

    MAX: ClassVar[int] = 32
    messages: list[Annotated[list[Message], Field(min_length=1)]] = Field(min_length=1, max_length=MAX)


def check_supported(req: ChatRequest) -> None:
    """Raises APIError 400 (code `unsupported_parameter`, param = the field) for an OpenAI field
    this server would otherwise drop while it changes what the client gets back."""
    refuse_unsupported(req.model_extra or {}, UNSUPPORTED_FIELDS, unsupported_parameter)
    for i, msg in enumerate(req.messages):
        for name, why in UNSUPPORTED_MESSAGE_FIELDS.items():
            value = (msg.model_extra or {}).get(name)
            if value not in (None, []):
                raise bad_request(f"messages[{i}].{name} is not supported: {why}", param=f"messages[{i}].{name}",
                                  code="unsupported_parameter")


def unsupported_parameter(name: str, why: str) -> APIError:
    """The HTTP routes' error for a field that validation.refuse_unsupported refuses (field -> (values that change
    nothing, why) tables such as UNSUPPORTED_FIELDS): 400, code `unsupported_parameter`, param = the field."""
    return bad_request(f"{name} is not supported: {why}", param=name, code="unsupported_parameter")


def extensions(req: ChatRequest) -> dict:
    """The extension fields (extra_body) `to_pipeline` passes on to the pipeline: the request's unknown fields
    but IGNORED_FIELDS and UNSUPPORTED_FIELDS. Raises APIError 400 for a pipeline-protocol key
    (pipeline_stream.extension_fields)."""
    return {k: v for k, v in pipeline_stream.extension_fields(req.model_extra).items()
            if k not in IGNORED_FIELDS and k not in UNSUPPORTED_FIELDS}


def _audio_part(part: dict, param: str, before_s: float, max_seconds: float) -> np.ndarray:
    """float32 mono 16 kHz samples of one input_audio content part (`param`: its path, e.g.
    `messages[0].content[1]`). `before_s`: seconds of input audio in the request's earlier parts; all
    together may last `max_seconds`. Raises APIError 400 naming `param + ".input_audio"`: invalid_audio, or
    audio_too_long (stating the limit and the seconds heard when decoding stopped)."""
    spec = part.get("input_audio")
    param += ".input_audio"
    if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
        raise bad_request("input_audio needs {'data': <base64>, 'format': 'wav'|'mp3'|...}", param=param)
    try:
        raw = base64.b64decode(spec["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"input_audio.data is not valid base64: {exc}", param=param, code="invalid_audio") from exc
    try:
        return audio_codec.decode(raw, INPUT_SAMPLE_RATE, max_seconds=max_seconds - before_s)
    except audio_codec.AudioDecodeError as exc:
        raise bad_request(f"input_audio could not be decoded: {exc}", param=param, code="invalid_audio") from exc
    except audio_codec.AudioTooLong as exc:
        earlier = f"{before_s:.1f} s in earlier parts, then " if before_s else ""
        raise bad_request(f"the request's input audio is longer than {max_seconds:g} s in all (limit "
                          f"--max-audio-seconds): {earlier}more than {exc.max_seconds:.1f} s in {param}",
                          param=param, code="audio_too_long") from exc


def stop_sequences(stop: str | list[str] | None, limits: RequestLimits) -> list[str]:
    """A request's `stop` as the pipeline REQUEST's list of strings. Raises APIError 400 (param "stop") for more
    than MAX_STOP_SEQUENCES, or (code `text_too_long`) for more than --max-text-chars characters in all."""
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if len(stop) > MAX_STOP_SEQUENCES:
        raise bad_request(f"at most {MAX_STOP_SEQUENCES} stop sequences", param="stop")
    if sum(len(s) for s in stop) > limits.max_text_chars:
        raise bad_request(f"stop is longer than {limits.max_text_chars} characters (limit --max-text-chars)",
                          param="stop", code="text_too_long")
    return stop


TEXT_AND_AUDIO = ("text", "input_audio")


def to_pipeline(req: ChatRequest, limits: RequestLimits | None = None,
                accepts: tuple[str, ...] = TEXT_AND_AUDIO) -> tuple[dict, dict[str, np.ndarray]]:
    """The pipeline REQUEST body and its input tensors: INPUT_AUDIO (with audio parts), INPUT_IMAGES and
    INPUT_IMAGE_SIZES (with image parts; `chat_images.image_tensors`).

    `accepts`: the part types the pipeline takes (`Pipeline.content`). Decodes input audio and images and fetches
    image URLs (blocking: call it from a worker thread in a server). Raises APIError 400 for unsupported fields or
    content (a part type outside `accepts`: param `messages[i].content[j].type`; files, tools), bad audio or images
    (param: the part's field), an audio format that cannot be streamed, or a request past `limits` (messages,
    characters of text, seconds of audio, images and their bytes and pixels).
    """
    limits = limits or RequestLimits()
    check_supported(req)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", param="stream_options",
                          code="unsupported_parameter")
    if len(req.messages) > limits.max_messages:
        raise bad_request(f"{len(req.messages)} messages; the limit is {limits.max_messages} (--max-messages)",
                          param="messages", code="too_many_messages")
    stop = stop_sequences(req.stop, limits)
    chars = sum(len(s) for s in stop)
    clips: list[np.ndarray] = []
    pixels: list[np.ndarray] = []
    offset = 0
    messages = []
    for i, msg in enumerate(req.messages):
        role = "system" if msg.role == "developer" else msg.role
        if role == "tool":
            raise bad_request("tool messages are not supported", param=f"messages[{i}].role")
        parts = [{"type": "text", "text": msg.content}] if isinstance(msg.content, str) else (msg.content or [])
        content = []
        for j, part in enumerate(parts):
            path = f"messages[{i}].content" + ("" if isinstance(msg.content, str) else f"[{j}]")
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in accepts:
                raise bad_request(f"content part type {kind!r} is not supported by model {req.model!r} (supported: "
                                  f"{', '.join(accepts)})", param=f"{path}.type", code="unsupported_content")
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise bad_request("text parts need a string 'text'", param=path)
                content.append({"type": "text", "text": part["text"]})
                chars += len(part["text"])
                if chars > limits.max_text_chars:
                    raise bad_request(f"the request's text is longer than {limits.max_text_chars} characters "
                                      "(limit --max-text-chars)", param=path, code="text_too_long")
            elif kind == "input_audio":
                if role != "user":
                    raise bad_request("input_audio is only accepted in user messages", param=path)
                pcm = _audio_part(part, path, offset / INPUT_SAMPLE_RATE, limits.max_audio_seconds)
                content.append({"type": "input_audio", "offset": offset, "samples": int(pcm.size),
                                "sample_rate": INPUT_SAMPLE_RATE})
                clips.append(pcm)
                offset += pcm.size
            elif kind == "image_url":
                if role != "user":
                    raise bad_request("image_url is only accepted in user messages", param=path)
                if len(pixels) == limits.max_images:
                    raise bad_request(f"more than {limits.max_images} images in one request (limit --max-images)",
                                      param=path, code="too_many_images")
                pixels.append(chat_images.image_part(part, path, limits))
                chat_images.check_padding(pixels, path, limits)
                content.append({"type": "image"})
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise bad_request("messages must contain at least one user message", param="messages")
    modalities = req.output_modalities()
    if "audio" in modalities and req.stream and req.audio and req.audio.format not in audio_codec.STREAMABLE:
        raise bad_request(f"audio.format {req.audio.format!r} cannot be streamed; use pcm16 or wav",
                          param="audio.format", code="unsupported_stream_format")
    # Extension fields (extra_body) pass through for pipelines that honour them; ROUTED_KEYS win.
    body = {**extensions(req), "messages": messages, "modalities": modalities,
            "voice": req.audio.voice if req.audio else None,
            "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
            "max_tokens": req.max_completion_tokens or req.max_tokens, "seed": req.seed, "stop": stop,
            "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
            "repetition_penalty": req.repetition_penalty}
    tensors = {"INPUT_AUDIO": np.concatenate(clips)} if clips else {}
    return body, {**tensors, **chat_images.image_tensors(pixels)}
