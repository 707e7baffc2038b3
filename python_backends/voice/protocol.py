"""The voice pipeline's request mapping (plain Python, used by its Triton orchestrator).

A chat pipeline REQUEST (see omni_frontend.chat_protocol) carries messages whose content is a list of
parts: {"type": "text", "text"} or {"type": "input_audio", "offset", "samples", "sample_rate"} pointing
into the INPUT_AUDIO tensor (float32 mono 16 kHz). The LLM stage takes plain {"role", "content": str}
messages, so audio parts are replaced by their transcripts.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from omni_backends.errors import RequestError

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "stop")


def text_messages(messages: Sequence[Mapping], transcripts: Sequence[str]) -> list[dict[str, str]]:
    """Messages with string content: text parts joined by spaces, input_audio parts replaced by `transcripts`
    (in order). Plain string content passes through. Raises RequestError for an unknown part type."""
    heard = iter(transcripts)
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            texts = []
            for part in content or []:
                kind = part.get("type")
                if kind not in ("text", "input_audio"):
                    raise RequestError(f"content part type {kind!r} is not supported by the voice pipeline",
                                       param="messages")
                texts.append(part.get("text", "") if kind == "text" else next(heard))
            content = " ".join(t for t in texts if t)
        out.append({"role": str(message.get("role")), "content": content})
    return out
