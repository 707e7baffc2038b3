"""One Qwen3-Omni chat turn as the Triton models read it from the pipeline REQUEST JSON (no Triton imports):
validation, the thinker's prompt / sampling / text stream, the talker's fields and sampling, and the
turn's usage for the final event. Shared by the stage models (`thinker_model`, `talker_model`), the BLS
orchestrator (`omni_model`) and the co-located stage (`colocated_model`).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from omni_backends.chat_request import audio_clips, check_request, input_images, text_chars
from omni_backends.engine import SamplingParams, TextStream
from omni_backends.engine.limits import check_prompt_chars
from omni_backends.engine.sampling import REQUEST_FIELDS as SAMPLING_FIELDS
from omni_backends.engine.sampling import check_context_length, request_sampling_params
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.prompt import ThinkerInputs
from omni_backends.qwen3_omni.serving.protocol import INPUT_AUDIO, INPUT_IMAGE_SIZES, INPUT_IMAGES, MEDIA_INPUTS, \
    TALKER_FIELDS
from omni_backends.serving import token_actions
from omni_backends.serving.events import silence
from omni_backends.serving.token_actions import completion_ids

MODALITIES = ("text", "audio")
# the REQUEST keys a turn reads (`prompt`, text or token ids, instead of `messages`: a completion, whose prompt the
# thinker reads without the chat template); `first_chunk_words` (the voice pipeline's first spoken chunk, which
# realtime sessions send) is accepted and has no effect: the talker speaks frame by frame
REQUEST_FIELDS = ("messages", "prompt", "modalities", "voice", "stop", *SAMPLING_FIELDS,
                  *(f"talker_{k}" for k in TALKER_FIELDS), "return_token_ids", "first_chunk_words")


Media = Mapping[str, np.ndarray]   # MEDIA_INPUTS the request brought, by tensor name


def media_inputs(read: Callable[[str], np.ndarray | None]) -> dict[str, np.ndarray]:
    """The request's optional media tensors (`MEDIA_INPUTS`: INPUT_AUDIO, INPUT_IMAGES, INPUT_IMAGE_SIZES) that are
    present, read by name with `read` (e.g. the request context's `input`)."""
    return {name: value for name in MEDIA_INPUTS if (value := read(name)) is not None}


def validate(body: dict, voices: Sequence[str], default_voice: str,
             media: Media | None = None) -> tuple[list[str], str | None]:
    """(modalities, voice or None for text only) of a REQUEST with its media tensors. Raises RequestError (HTTP 400)
    for a field of the wrong JSON type (`chat_request.check_request`, param: its path), empty messages,
    max_tokens <= 0, an unknown modality, the audio modality for a completion's `prompt`, an unknown voice (the message
    lists `voices`), an input_audio part outside INPUT_AUDIO or a NaN / infinite sample in it, image tensors that do
    not fit the image parts (`chat_request.input_images`). A key outside REQUEST_FIELDS was refused before (the
    models' `request_fields`, checked by AsyncDecoupledModel)."""
    media = media or {}
    check_request(body, images=True)
    if body.get("prompt") is None:
        audio_clips(body["messages"], media.get(INPUT_AUDIO), images=True)
        input_images(body["messages"], media.get(INPUT_IMAGES), media.get(INPUT_IMAGE_SIZES))
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
        raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
    modalities = body.get("modalities") or list(MODALITIES)
    if not isinstance(modalities, list) or not set(modalities) <= set(MODALITIES):
        raise RequestError(f"modalities must be a non-empty subset of {list(MODALITIES)}", param="modalities")
    if "audio" not in modalities:
        return modalities, None
    if body.get("prompt") is not None:   # the talker's prompt is built from the chat template's turns
        raise RequestError("a completion's prompt is answered in text only: modalities must be [\"text\"]",
                           param="modalities")
    return modalities, resolve_voice(body.get("voice") or default_voice, voices)


def resolve_voice(name, voices: Sequence[str]) -> str:
    """The checkpoint's speaker for a requested voice name (case-insensitive). Raises RequestError (param
    "voice") listing `voices` when it is unknown."""
    found = str(name).lower()
    if found not in voices:
        raise RequestError(f"unknown voice {name!r}; valid voices: {', '.join(voices)}", param="voice")
    return found


def thinker_request(thinker, body: dict, media: Media | None,
                    default_max_tokens: int) -> tuple[ThinkerInputs, SamplingParams, TextStream]:
    """The thinker's inputs, sampling parameters and text stream of one REQUEST with its media tensors (`thinker`:
    a `Thinker`; `media`: `media_inputs`).

    Sampling (`request_sampling_params`): temperature (0 or null: greedy), top_p, top_k (-1/0: off), max_tokens
    (null: `default_max_tokens`, cut at the room the prompt leaves in the context, as OpenAI and vLLM do; only a
    max_tokens the request sends is refused for not fitting), min_tokens (vLLM's extension: `<|im_end|>` is
    suppressed before that many tokens), seed, presence_penalty, frequency_penalty, repetition_penalty; stop strings
    end the text. A REQUEST with `prompt` (text or token ids) prefills it as it is (`token_actions.completion_ids`),
    without the chat template, and takes no media tensor. A prompt too long for the context is refused from its
    length before it is tokenized. `body` has passed `chat_request.check_request` (`validate` runs it; a stage
    called alone runs it first). Raises RequestError naming a bad field (or a prompt that does not fit)."""
    media = media or {}
    params = request_sampling_params(body, thinker.sampling_params(max_tokens=default_max_tokens, temperature=0.0))
    sent = body.get("max_tokens") is not None
    least = params.max_tokens if sent else max(1, params.min_tokens)   # the tokens the prompt must leave room for
    if body.get("prompt") is not None:   # a completion: the prompt as it is, no chat template
        if media:
            name = next(iter(media))
            raise RequestError(f"a completion's prompt is text or token ids: it takes no {name} tensor", param=name)
        ids = completion_ids(thinker.prompts.tokenizer, body["prompt"], least, thinker.context_length,
                             thinker.longest_token)
        inputs = ThinkerInputs(input_ids=torch.tensor(ids, dtype=torch.long))
    else:
        messages = body["messages"]
        check_prompt_chars(text_chars(messages), least, thinker.context_length, thinker.longest_token)
        inputs = thinker.prompts.build(messages, audio_clips(messages, media.get(INPUT_AUDIO), images=True),
                                       input_images(messages, media.get(INPUT_IMAGES), media.get(INPUT_IMAGE_SIZES)))
        check_context_length(len(inputs.input_ids), least, thinker.context_length)
    if not sent:
        params = dataclasses.replace(params, max_tokens=min(params.max_tokens,
                                                            thinker.context_length - len(inputs.input_ids)))
    stop = body.get("stop") or []
    text = TextStream(thinker.prompts.tokenizer, len(inputs.input_ids), [stop] if isinstance(stop, str) else stop)
    return inputs, params, text


def token_action(thinker, body: dict, default_max_tokens: int) -> dict:
    """The thinker's answer to a token control REQUEST ({"action": "prompt_tokens" | "detokenize"}, see
    `omni_backends.serving.token_actions`; max_tokens null: `default_max_tokens`), by its tokenizer and chat template.
    Raises RequestError (HTTP 400) naming the bad field, or `context_length_exceeded`."""
    params = request_sampling_params(body, thinker.sampling_params(max_tokens=default_max_tokens, temperature=0.0))
    return token_actions.answer(body, thinker.prompts.tokenizer, thinker.prompts.text, params.max_tokens,
                                thinker.context_length, thinker.longest_token)


def talker_fields(body: dict, voice: str) -> dict:
    """The talker's settings of a REQUEST: its `talker_*` extension fields, the voice and the seed (the
    TALKER_PARAMS JSON of the stage layout)."""
    return {**{k: body.get(f"talker_{k}") for k in TALKER_FIELDS}, "voice": voice, "seed": body.get("seed")}


_FRAME_FIELDS = {"max_tokens": "max_frames", "min_tokens": "min_frames"}   # SamplingParams name -> talker field
_ENGINE_NAME = re.compile(r"\b(max_tokens|min_tokens)\b")


def talker_sampling(talker, fields: dict, default_max_frames: int) -> SamplingParams:
    """`Talker.sampling_params` from `talker_fields` (null fields: generate()'s talker defaults; top_k -1: off;
    max_frames: `default_max_frames`, also its upper bound). Raises RequestError naming the talker_* field."""
    values = {k: fields[k] for k in TALKER_FIELDS if fields.get(k) is not None}
    if values.get("top_k") == -1:
        values["top_k"] = 0
    frames = values.setdefault("max_frames", default_max_frames)
    if not isinstance(frames, int) or isinstance(frames, bool) or not 1 <= frames <= default_max_frames:
        raise RequestError(f"talker_max_frames must be an integer in [1, {default_max_frames}], got {frames!r}",
                           param="talker_max_frames")
    try:
        return talker.sampling_params(**values, seed=fields.get("seed"))
    except (TypeError, ValueError) as exc:
        # the engine's SamplingParams counts frames as tokens: name the request's fields in the message and param
        message = _ENGINE_NAME.sub(lambda m: f"talker_{_FRAME_FIELDS[m.group(0)]}", str(exc))
        field = next((k for k in values if message.startswith((k, f"talker_{k}"))), None)
        raise RequestError(f"invalid talker sampling parameter: {message}",
                           param=None if field is None else f"talker_{field}") from None


class Turn:
    """What a turn accumulates for its final event: generated token ids, the thinker's finish reason and
    usage, and the codec frames spoken; and the thinker text not yet sent as an audio event's transcript."""

    def __init__(self, body: dict, voice: str | None):
        self.body, self.voice = body, voice
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.usage: dict = {}
        self.frames = 0
        self.unspoken: list[str] = []
        self.audio_sent = False  # an audio.delta with samples went out

    def last_audio(self, sample_rate: int) -> tuple[dict, np.ndarray | None] | None:
        """The turn's closing audio.delta, or None when none is needed: the text written after the last audio
        chunk (or past talker_max_frames) as a transcript without samples; when no audio went out at all (the
        talker ended before its first frame) 10 ms of silence (`events.silence`), so an answer with the audio
        modality always has audio, as voice's (its voice cannot say "👍") and OpenAI's."""
        if self.audio_sent and not any(self.unspoken):
            return None
        pcm = None if self.audio_sent else silence(sample_rate)
        self.audio_sent = True
        return {"type": "audio.delta", "sample_rate": sample_rate, "transcript": self.take_transcript()}, pcm

    def take_transcript(self) -> str:
        """The thinker text written since the previous audio event (the next audio event's transcript)."""
        text, self.unspoken = "".join(self.unspoken), []
        return text

    def done_event(self) -> dict:
        """{"type": "done", "finish_reason", "usage": {"prompt_tokens", "completion_tokens" (text tokens +
        codec frames), "completion_tokens_details": {"text_tokens", "audio_tokens"}}} (+ "token_ids" when
        the request asked for them with "return_token_ids")."""
        text_tokens = self.usage.get("completion_tokens", len(self.token_ids))
        usage = {"prompt_tokens": self.usage.get("prompt_tokens", 0), "completion_tokens": text_tokens + self.frames,
                 "completion_tokens_details": {"text_tokens": text_tokens, "audio_tokens": self.frames}}
        event = {"type": "done", "finish_reason": self.finish_reason, "usage": usage}
        if self.body.get("return_token_ids"):
            event["token_ids"] = self.token_ids
        return event
