"""The tensor protocol of client-facing pipeline models (any Triton gRPC client can speak it).

Inputs
  REQUEST   BYTES [1]  JSON request (OpenAI-like: messages / input / voice / sampling fields)
Outputs (decoupled: one response per event, then an empty FINAL response)
  EVENT     BYTES [1]  JSON event: {"type": "text.delta", "text"} | {"type": "audio.delta",
                       "sample_rate", "transcript"} | {"type": "done", "finish_reason", "usage"} |
                       pipeline-specific types
                       (REQUEST {"action": "voices"} to a pipeline that speaks -> one
                       {"type": "voices", "voices": [str], "default": str};
                       REQUEST {"action": "prompt_tokens", "messages", "max_tokens"} to a chat pipeline
                       (counted by its LLM's tokenizer: voice_llm's, qwen3_omni's thinker's) -> one
                       {"type": "prompt_tokens", "prompt_tokens": int, "context_length": int}, or its 400
                       `context_length_exceeded` when the messages plus max_tokens cannot fit its context;
                       `prompt` instead of messages, "return_token_ids", {"action": "detokenize", "tokens"}: see
                       omni_backends.serving.token_actions, which `voice` and `qwen3_omni` answer)
  AUDIO     FP32 [-1]  PCM samples of an "audio.delta" event (mono, at the event's sample_rate);
                       an empty tensor for other events. A chat answer asked with the "audio" modality always
                       has an audio.delta with samples: text the voice cannot say (an emoji-only reply, "👍") is
                       `silence()` (10 ms) with that text as its transcript, as the speech WebSocket sends for
                       such a sentence, so every client gets an audio object (OpenAI's always has one).
Errors: a Triton error response whose message is the OpenAI error envelope as JSON (see
omni_backends.errors.RequestError), then FINAL.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Mapping

import numpy as np

from omni_backends.errors import RequestError

REQUEST = "REQUEST"
EVENT = "EVENT"
AUDIO = "AUDIO"
_EMPTY_AUDIO = np.zeros((0,), dtype=np.float32)
SILENCE_S = 0.01  # the audio of text with nothing to say (the speech WebSocket's, omni_frontend.audio.encode)


def silence(sample_rate: int) -> np.ndarray:
    """float32 [samples]: SILENCE_S of silence at `sample_rate`, the audio of a chunk of text the voice cannot say."""
    return np.zeros(max(1, round(sample_rate * SILENCE_S)), dtype=np.float32)


def json_tensor(value) -> np.ndarray:
    """BYTES [1] holding `value` as JSON (add a leading [None] for a batched input)."""
    return np.array([json.dumps(value).encode()], dtype=np.object_)


def read_json(tensor: np.ndarray):
    """The JSON value of a BYTES tensor holding one element (any shape). Raises ValueError if not JSON."""
    raw = tensor.reshape(-1)[0]
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)


def require_known_fields(body: dict, known: Collection[str], model: str,
                         hints: Mapping[str, str] | None = None) -> None:
    """Refuses a REQUEST holding a key that `model` does not read: an extension field it would otherwise drop
    silently (e.g. `guidance_scale` where the model's scale is `true_cfg_scale`), a typo of a known one, or an
    OpenAI field the pipeline does not honour. A null value is an absent field (accepted). Raises RequestError
    (HTTP 400, code `unsupported_parameter`, param: the first such key in sorted order) listing `known`;
    `hints` (field -> advice) adds a sentence."""
    unknown = sorted(k for k, v in body.items() if v is not None and k not in known)
    if unknown:
        name = unknown[0]
        hint = (hints or {}).get(name)
        raise RequestError(f"{name} is not a request field of model {model}" + (f": {hint}" if hint else "") +
                           f" (its fields: {', '.join(sorted(known))})", param=name, code="unsupported_parameter")


def wants_fields(body: dict) -> bool:
    """True for the REQUEST {"action": "fields"}, which every model with `request_fields`
    (omni_backends.serving.decoupled.AsyncDecoupledModel) answers with fields_event."""
    return body.get("action") == "fields"


def fields_event(known: Collection[str], hints: Mapping[str, str] | None = None) -> dict:
    """The one event answering {"action": "fields"}: {"type": "fields", "fields": [the REQUEST keys the model
    reads, sorted], "hints": {field it refuses: advice}}, what `require_known_fields` checks against. A client
    (the frontend) refuses an unread field with it before it queues the request."""
    return {"type": "fields", "fields": sorted(known), "hints": dict(hints or {})}


def wants_voices(body: dict) -> bool:
    """True for the REQUEST {"action": "voices"[, "voice": name]}, which every pipeline that speaks answers
    with voices_event."""
    return body.get("action") == "voices"


def voices_event(voices, default: str, body: dict | None = None, resolve=None) -> dict:
    """The one event answering {"action": "voices"}: the voice names a request may pass, and the default.

    When the REQUEST `body` names a "voice", `resolve(voice)` (the pipeline's own check of a request's
    `voice`, e.g. omni_backends.voice.tts.resolve_voice) runs first, so a name the pipeline would refuse
    raises its RequestError (param "voice") now, and the event adds "voice": the name it resolves to.
    Clients check a voice this way before they use it (the realtime session at `session.update`)."""
    event = {"type": "voices", "voices": list(voices), "default": default}
    if (body or {}).get("voice") is not None:
        event["voice"] = resolve(body["voice"])
    return event


def wants_prompt_tokens(body: dict) -> bool:
    """True for the REQUEST {"action": "prompt_tokens", "messages": [...], "max_tokens": int}: how many tokens
    the chat pipeline's LLM would prefill for `messages`, checked against its context with `max_tokens`
    (answered with prompt_tokens_event, or refused as a request with those fields would be). A client checks a
    system prompt this way before it keeps it (the realtime session's instructions at `session.update`)."""
    return body.get("action") == "prompt_tokens"


def prompt_tokens_event(prompt_tokens: int, context_length: int, token_ids: list[int] | None = None) -> dict:
    """The one event answering {"action": "prompt_tokens"}: the prompt's token count and the LLM's context
    length (tokens); with `token_ids` (asked with "return_token_ids": true) the prompt's ids too."""
    event = {"type": "prompt_tokens", "prompt_tokens": prompt_tokens, "context_length": context_length}
    if token_ids is not None:
        event["token_ids"] = list(token_ids)
    return event


def wants_detokenize(body: dict) -> bool:
    """True for the REQUEST {"action": "detokenize", "tokens": [int]}: the text of token ids by the chat pipeline's
    LLM tokenizer (answered with detokenized_event; an id outside its vocabulary is a 400 naming `tokens`)."""
    return body.get("action") == "detokenize"


def detokenized_event(text: str) -> dict:
    """The one event answering {"action": "detokenize"}: the ids' text."""
    return {"type": "detokenized", "text": text}


def encode_event(event: dict, audio: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Output tensors for one event: EVENT bytes [1] and AUDIO float32 [samples] (empty if none)."""
    pcm = _EMPTY_AUDIO if audio is None else np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    return {EVENT: json_tensor(event), AUDIO: pcm}


def decode_request(raw: np.ndarray) -> dict:
    """Parses the REQUEST tensor (bytes [1] or [1, 1]); raises RequestError if it is not a JSON object."""
    from omni_backends.errors import RequestError

    try:
        body = read_json(raw)
    except (ValueError, IndexError) as exc:
        raise RequestError(f"REQUEST must hold one JSON object: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("REQUEST must hold one JSON object")
    return body
