"""The chat pipeline REQUEST (see omni_frontend.chat_protocol), as every chat pipeline reads it.

Messages carry content parts {"type": "text", "text"} or {"type": "input_audio", "offset", "samples",
"sample_rate"} pointing into the INPUT_AUDIO tensor (float32 mono 16 kHz [total_samples]).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from omni_backends.errors import RequestError


def audio_clips(messages: Sequence[Mapping], input_audio: np.ndarray | None) -> list[np.ndarray]:
    """The input_audio parts' samples, in message order: float32 [samples] mono 16 kHz each.

    Raises RequestError when a part points outside INPUT_AUDIO or is not 16 kHz.
    """
    clips = []
    audio = np.zeros(0, np.float32) if input_audio is None else np.asarray(input_audio, np.float32).reshape(-1)
    for part in _parts(messages):
        if part.get("type") != "input_audio":
            continue
        start, count = int(part.get("offset", 0)), int(part.get("samples", 0))
        if part.get("sample_rate", 16000) != 16000 or start < 0 or count <= 0 or start + count > audio.size:
            raise RequestError("input_audio part must be 16 kHz and lie inside INPUT_AUDIO", param="messages")
        clips.append(audio[start:start + count])
    return clips


def text_chars(messages: Sequence[Mapping]) -> int:
    """Characters of all text in `messages` (string contents and text parts), for size checks made
    before tokenizing (omni_backends.engine.limits.check_prompt_chars)."""
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part["text"]) for part in content
                         if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return total


def _parts(messages: Sequence[Mapping]):
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str):
            yield from content or []
