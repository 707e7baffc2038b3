"""OpenAI chat-completions request validation and its mapping onto a chat pipeline's REQUEST.

Pipeline REQUEST JSON (what any Triton client sends to a chat pipeline such as `voice` or
`qwen3_omni`):
  {"messages": [{"role": "system"|"user"|"assistant", "content": [
        {"type": "text", "text": str} |
        {"type": "input_audio", "offset": int, "samples": int, "sample_rate": 16000}]}],
   "modalities": ["text"] | ["audio"] | ["text", "audio"], "voice": str | null,
   "temperature", "top_p", "top_k", "max_tokens", "seed", "presence_penalty", "frequency_penalty",
   "repetition_penalty", "stop": [str]}
Input audio travels as float32 mono 16 kHz samples in the INPUT_AUDIO tensor [total_samples];
each input_audio part points at its slice (offset, samples).
"""
from __future__ import annotations

import base64
import binascii
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from omni_frontend import audio as audio_codec
from omni_frontend.errors import bad_request

INPUT_SAMPLE_RATE = 16000
AudioFormat = Literal["wav", "pcm16", "flac", "mp3", "opus", "aac"]


class AudioParams(BaseModel):
    voice: str
    format: AudioFormat = "wav"


class StreamOptions(BaseModel):
    include_usage: bool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None


class ChatRequest(BaseModel):
    """The OpenAI request fields we honour; unknown fields (extra_body) are passed to the pipeline,
    which uses those it knows and ignores the rest; `n` > 1 is rejected."""

    model_config = ConfigDict(extra="allow", strict=True)  # "10" is not an integer, "yes" not a boolean
    model: str
    messages: list[Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioParams | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=-2**63, le=2**63 - 1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)  # vLLM's extension
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)

    @field_validator("modalities")
    @classmethod
    def _non_empty(cls, value):
        if value is not None and not value:
            raise ValueError("modalities must not be empty")
        return value

    def output_modalities(self) -> list[str]:
        """Both text and audio unless asked otherwise (vLLM-Omni's default for omni models)."""
        return list(dict.fromkeys(self.modalities or ["text", "audio"]))


def _audio_part(part: dict, index: int) -> np.ndarray:
    spec = part.get("input_audio")
    param = f"messages[{index}].content.input_audio"
    if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
        raise bad_request("input_audio needs {'data': <base64>, 'format': 'wav'|'mp3'|...}", param=param)
    try:
        raw = base64.b64decode(spec["data"], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"input_audio.data is not valid base64: {exc}", param=param, code="invalid_audio") from exc
    try:
        return audio_codec.decode(raw, INPUT_SAMPLE_RATE)
    except audio_codec.AudioDecodeError as exc:
        raise bad_request(f"input_audio could not be decoded: {exc}", param=param, code="invalid_audio") from exc


def to_pipeline(req: ChatRequest, default_voice: str | None = None) -> tuple[dict, np.ndarray | None]:
    """The pipeline REQUEST body and the INPUT_AUDIO tensor (None without audio parts).

    Raises APIError 400 for unsupported content (images, files), bad audio, or an audio format
    that cannot be streamed.
    """
    clips: list[np.ndarray] = []
    offset = 0
    messages = []
    for i, msg in enumerate(req.messages):
        role = "system" if msg.role == "developer" else msg.role
        if role == "tool":
            raise bad_request("tool messages are not supported", param=f"messages[{i}].role")
        parts = [{"type": "text", "text": msg.content}] if isinstance(msg.content, str) else (msg.content or [])
        content = []
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise bad_request("text parts need a string 'text'", param=f"messages[{i}].content")
                content.append({"type": "text", "text": part["text"]})
            elif kind == "input_audio":
                if role != "user":
                    raise bad_request("input_audio is only accepted in user messages", param=f"messages[{i}].content")
                pcm = _audio_part(part, i)
                content.append({"type": "input_audio", "offset": offset, "samples": int(pcm.size),
                                "sample_rate": INPUT_SAMPLE_RATE})
                clips.append(pcm)
                offset += pcm.size
            else:
                raise bad_request(f"content part type {kind!r} is not supported by this server "
                                  "(supported: text, input_audio)", param=f"messages[{i}].content",
                                  code="unsupported_content")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in messages):
        raise bad_request("messages must contain at least one user message", param="messages")
    modalities = req.output_modalities()
    if "audio" in modalities and req.stream and req.audio and req.audio.format not in audio_codec.STREAMABLE:
        raise bad_request(f"audio.format {req.audio.format!r} cannot be streamed; use pcm16 or wav",
                          param="audio.format", code="unsupported_stream_format")
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    # Extension fields (extra_body) pass through for pipelines that honour them; known keys win.
    body = {**(req.model_extra or {}), "messages": messages, "modalities": modalities,
            "voice": req.audio.voice if req.audio else default_voice,
            "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
            "max_tokens": req.max_completion_tokens or req.max_tokens, "seed": req.seed, "stop": stop,
            "presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty,
            "repetition_penalty": req.repetition_penalty}
    return body, (np.concatenate(clips) if clips else None)

