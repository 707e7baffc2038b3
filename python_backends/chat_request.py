"""The chat pipeline REQUEST (see omni_frontend.chat_protocol), as every chat pipeline reads it.

Messages carry content parts {"type": "text", "text"} or {"type": "input_audio", "offset", "samples",
"sample_rate"} pointing into the INPUT_AUDIO tensor (float32 mono 16 kHz [total_samples]); for pipelines that take
images (qwen3_omni: `images=True`) also {"type": "image"}, the k-th of which is image k of INPUT_IMAGES (uint8
[K, H, W, 3], padded to the largest H, W) with its real size in INPUT_IMAGE_SIZES (int32 [K, 2]: h, w).

`check_request` is the one type check of a REQUEST body, run by every model that parses chat messages
(voice, voice_llm, qwen3_omni, qwen3_omni_thinker, the co-located qwen3_omni) before any field is used: any JSON
of the wrong shape is a RequestError (HTTP 400) whose param is the field's path, e.g.
`messages[0].content[1].offset`, never a Python exception (a 500). Ranges of the sampling fields are checked
where they are used (omni_backends.engine.sampling.request_sampling_params, also a 400).

A completion REQUEST (omni_frontend.completions_protocol) carries `prompt` instead of `messages`: text, or token ids,
that reach the LLM as they are, without the chat template (`prompt_ids` turns either into ids).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.input_audio import SAMPLE_RATE, check_audio

ROLES = ("system", "user", "assistant")
PART_TYPES = ("text", "input_audio")
IMAGE_PART = "image"
MODALITIES = ("text", "audio")
NUMBER_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
INTEGER_FIELDS = ("max_tokens", "min_tokens", "top_k", "seed")
BOOLEAN_FIELDS = ("return_token_ids", "talker_inputs")


def check_request(body: Mapping, *, parts: bool = True, images: bool = False) -> None:
    """Type check of a chat REQUEST body's fields (absent or null ones but `messages` or `prompt` are fine):
    messages (`check_messages`) or else, never both, prompt (`check_prompt`), modalities (a non-empty list of
    "text" / "audio"), voice (a string), stop (a string or a list of strings), the sampling numbers (NUMBER_FIELDS:
    numbers; INTEGER_FIELDS: integers; a JSON boolean is neither) and BOOLEAN_FIELDS. `parts` False: message content
    must be a string (voice_llm); `images` True: image parts are accepted (qwen3_omni). Raises RequestError
    (HTTP 400) whose param names the field."""
    if body.get("prompt") is None:
        check_messages(body.get("messages"), parts=parts, images=images)
    elif body.get("messages") is not None:
        raise RequestError("a REQUEST carries messages (a chat) or prompt (a completion), not both", param="prompt")
    else:
        check_prompt(body["prompt"])
    modalities = body.get("modalities")
    if modalities is not None and (not isinstance(modalities, list) or not modalities
                                   or any(not isinstance(m, str) or m not in MODALITIES for m in modalities)):
        raise RequestError(f"modalities must be a non-empty list of {list(MODALITIES)}, got {modalities!r}",
                           param="modalities")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise RequestError(f"voice must be a voice name (a string), got {_kind(voice)}", param="voice")
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str):
        if not isinstance(stop, list):
            raise RequestError(f"stop must be a string or a list of strings, got {_kind(stop)}", param="stop")
        for i, item in enumerate(stop):
            if not isinstance(item, str):
                raise RequestError(f"stop[{i}] must be a string, got {_kind(item)}", param=f"stop[{i}]")
    for name in NUMBER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RequestError(f"{name} must be a number, got {_kind(value)}", param=name)
    for name in INTEGER_FIELDS:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RequestError(f"{name} must be an integer, got {_kind(value)}", param=name)
    for name in BOOLEAN_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise RequestError(f"{name} must be a boolean, got {_kind(value)}", param=name)


def check_prompt(prompt, param: str = "prompt") -> None:
    """Type check of a completion's `prompt`: a string, or a non-empty list of token ids (integers >= 0; their
    range is the tokenizer's, checked by `prompt_ids`). Raises RequestError (HTTP 400, param `param`)."""
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list) or not prompt:
        raise RequestError(f"{param} must be a string or a non-empty list of token ids, got {_kind(prompt)}",
                           param=param)
    for i, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise RequestError(f"{param}[{i}] must be a token id (an integer >= 0), got {_kind(token)}",
                               param=param)


def prompt_ids(tokenizer, prompt, add_special_tokens: bool = True, param: str = "prompt") -> list[int]:
    """Token ids of a prompt that passed `check_prompt`: a string's tokenization by `tokenizer` (a transformers
    tokenizer; `add_special_tokens` as its call takes it, no chat template), or the ids themselves. Raises
    RequestError (HTTP 400, param `param`, code `invalid_token_id`) for an id outside the tokenizer's vocabulary
    (0 .. len(tokenizer) - 1)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    return check_token_ids(tokenizer, prompt, param)


def check_token_ids(tokenizer, ids, param: str) -> list[int]:
    """`ids` (a list of integers) when each lies in the vocabulary of `tokenizer` (0 .. len(tokenizer) - 1); else
    RequestError (HTTP 400, param `param`, code `invalid_token_id`) naming the first one outside it."""
    vocab = len(tokenizer)
    if not isinstance(ids, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
        raise RequestError(f"{param} must be a list of token ids (integers), got {_kind(ids)}", param=param)
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise RequestError(f"{param}[{i}]: token id {token} is outside the vocabulary (0 .. {vocab - 1})",
                               param=param, code="invalid_token_id")
    return list(ids)


def check_messages(messages, *, parts: bool = True, images: bool = False) -> None:
    """Type check of `messages`: a non-empty list of objects {"role": one of ROLES, "content": a string, null, or
    (with `parts`) a list of part objects}; a part is {"type": "text", "text": str} or {"type": "input_audio",
    "offset": int >= 0 (default 0), "samples": int > 0, "sample_rate": 16000 (the default)}, or with `images`
    {"type": "image"}; null is an absent field.
    Raises RequestError (HTTP 400) whose param is the path of the first bad value, e.g. `messages[0].content[1].offset`."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(message, dict):
            raise RequestError(f"{path} must be an object {{role, content}}, got {_kind(message)}", param=path)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestError(f"{path}.role must be one of {list(ROLES)}, got {role!r}", param=f"{path}.role")
        content = message.get("content")
        if isinstance(content, str) or (content is None and parts):
            continue
        if not parts:
            raise RequestError(f"{path}.content must be a string, got {_kind(content)}", param=f"{path}.content")
        if not isinstance(content, list):
            raise RequestError(f"{path}.content must be a string or a list of content parts, got {_kind(content)}",
                               param=f"{path}.content")
        for j, part in enumerate(content):
            _check_part(part, f"{path}.content[{j}]", (*PART_TYPES, IMAGE_PART) if images else PART_TYPES)


def _check_part(part, path: str, types: tuple[str, ...]) -> None:
    if not isinstance(part, dict):
        raise RequestError(f"{path} must be a content part object {{type, ...}}, got {_kind(part)}", param=path)
    kind = part.get("type")
    if not isinstance(kind, str) or kind not in types:
        raise RequestError(f"{path}.type: content part type {kind!r} is not supported (supported: "
                           f"{', '.join(types)})", param=f"{path}.type", code="unsupported_content")
    if kind == IMAGE_PART:
        return
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{path}.text must be a string, got {_kind(part.get('text'))}", param=f"{path}.text")
        return
    for name, least, default in (("offset", 0, 0), ("samples", 1, None)):
        value = part.get(name)
        value = default if value is None else value   # null: an absent field
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RequestError(f"{path}.{name} must be an integer >= {least}, got {value!r}", param=f"{path}.{name}")
    rate = SAMPLE_RATE if part.get("sample_rate") is None else part["sample_rate"]
    if isinstance(rate, bool) or rate != SAMPLE_RATE:
        raise RequestError(f"{path}.sample_rate must be {SAMPLE_RATE}, got {rate!r}", param=f"{path}.sample_rate")


def _kind(value) -> str:
    """The JSON type of `value` and a short repr, for error messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return f"{names.get(type(value), type(value).__name__)} ({str(value)[:40]!r})"


def audio_clips(messages: Sequence[Mapping], input_audio: np.ndarray | None, *,
                images: bool = False) -> list[np.ndarray]:
    """The input_audio parts' samples, in message order: float32 [samples] mono 16 kHz each, of messages
    that passed `check_messages` (this checks them again; `images` as there).

    Raises RequestError when INPUT_AUDIO holds a NaN or infinite sample (input_audio.check_audio), or a part
    points outside INPUT_AUDIO (param: the part's path).
    """
    check_messages(messages, images=images)
    audio = check_audio(np.zeros(0, np.float32) if input_audio is None else input_audio, "INPUT_AUDIO",
                        allow_empty=True)
    clips = []
    for path, part in _parts(messages):
        if part["type"] != "input_audio":
            continue
        start, count = part.get("offset") or 0, part["samples"]
        if start + count > audio.size:
            raise RequestError(f"{path}: the input_audio part (offset {start}, {count} samples) must lie inside "
                               f"INPUT_AUDIO ({audio.size} samples)", param=path)
        clips.append(audio[start:start + count])
    return clips


def input_images(messages: Sequence[Mapping], images: np.ndarray | None,
                 sizes: np.ndarray | None) -> list[np.ndarray]:
    """The image parts' pixels, in message order: uint8 [h, w, 3] RGB each, cut from INPUT_IMAGES (`images`: uint8
    [K, H, W, 3], padded to the largest H, W) by INPUT_IMAGE_SIZES (`sizes`: int32 [K, 2], each image's real
    (h, w)), of messages that passed `check_messages(images=True)`.

    Raises RequestError (HTTP 400) when K is not the number of image parts (param "messages"), a tensor has the
    wrong dtype or shape, or a size is outside [1, H] x [1, W] (param: the tensor's name).
    """
    wanted = sum(part.get("type") == IMAGE_PART for _, part in _parts(messages))
    if images is None and sizes is None:
        if wanted:
            raise RequestError(f"{wanted} image part(s) but no INPUT_IMAGES tensor", param="messages")
        return []
    if images is None or sizes is None:
        missing = "INPUT_IMAGES" if images is None else "INPUT_IMAGE_SIZES"
        raise RequestError(f"INPUT_IMAGES and INPUT_IMAGE_SIZES come together; {missing} is missing", param=missing)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise RequestError(f"INPUT_IMAGES must be uint8 [K, H, W, 3], got {images.dtype} {list(images.shape)}",
                           param="INPUT_IMAGES")
    if sizes.dtype != np.int32 or sizes.shape != (images.shape[0], 2):
        raise RequestError(f"INPUT_IMAGE_SIZES must be int32 [{images.shape[0]}, 2], got {sizes.dtype} "
                           f"{list(sizes.shape)}", param="INPUT_IMAGE_SIZES")
    if images.shape[0] != wanted:
        raise RequestError(f"{wanted} image part(s) but {images.shape[0]} image(s) in INPUT_IMAGES", param="messages")
    height, width = images.shape[1:3]
    out = []
    for k, (h, w) in enumerate(sizes.tolist()):
        if not (1 <= h <= height and 1 <= w <= width):
            raise RequestError(f"INPUT_IMAGE_SIZES[{k}] = ({h}, {w}) must lie within the tensor's {height}x{width}",
                               param="INPUT_IMAGE_SIZES")
        out.append(images[k, :h, :w])
    return out


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
    """(path, part) of every content part of checked messages, in order."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                yield f"messages[{i}].content[{j}]", part
