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
FIRST_CHUNK_WORDS = "first_chunk_words"  # REQUEST extension field, see chunker_options
MAX_FIRST_CHUNK_WORDS = 40
# a chat REQUEST's keys (`prompt` instead of `messages`: a completion's raw prompt)
REQUEST_FIELDS = ("messages", "prompt", "modalities", "voice", *SAMPLING_FIELDS, FIRST_CHUNK_WORDS)


def chunker_options(body: Mapping) -> dict[str, int]:
    """`SentenceChunker` keyword arguments for the speech of one REQUEST: none (the chunker's defaults: a first chunk
    of 2-3 words) unless the extension field `first_chunk_words` N is given, an integer 1-40: the first spoken chunk
    then holds at most N words (ending at a clause boundary once it holds min(2, N)), and chunk k at most N * 2**k.
    Realtime sessions send 2 (omni_frontend.realtime.session). Raises RequestError (param first_chunk_words)."""
    words = body.get(FIRST_CHUNK_WORDS)
    if words is None:
        return {}
    if isinstance(words, bool) or not isinstance(words, int) or not 1 <= words <= MAX_FIRST_CHUNK_WORDS:
        raise RequestError(f"{FIRST_CHUNK_WORDS} must be an integer from 1 to {MAX_FIRST_CHUNK_WORDS}, got {words!r}",
                           param=FIRST_CHUNK_WORDS)
    return {"first_max_words": words, "first_min_words": min(2, words)}


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
