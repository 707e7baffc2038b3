"""POST /v1/chat/completions for chat pipelines (text and speech out), non-streamed and SSE.

Audio out: non-streamed `message.audio = {id, data (base64 in audio.format), expires_at,
transcript}`; streamed `delta.audio = {id, data (base64, only the new audio), expires_at,
transcript, sample_rate}` where data is raw PCM16 mono (format pcm16) or, for format wav, a
streaming WAV whose header comes in the first audio chunk. The sample rate is the pipeline's
(24000 Hz for the built-in pipelines) and is stated in `sample_rate`. `transcript` is the text
spoken in that chunk (the pipeline's `audio.delta` transcript; the streamed transcripts concatenate
to message.audio.transcript), also with `modalities: ["audio"]`, where `content` stays empty.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import time

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from omni_frontend import admission, batching, generation, observability, pipeline_stream
from omni_frontend import audio as audio_codec
from omni_frontend.chat_protocol import (INPUT_SAMPLE_RATE, ROUTED_KEYS, ChatBatchRequest, ChatRequest, extensions,
                                        to_pipeline)
from omni_frontend.errors import APIError, bad_request
from omni_frontend.observability import RequestTimer
from omni_frontend.pipelines import CHAT
from omni_frontend.routes.common import config, pipeline_for, refuse_unread_fields

router = APIRouter()
# Pipeline REQUEST keys whose request field has another name: a pipeline's error naming the key names the field.
_FIELD_OF_KEY = {"voice": "audio.voice"}


class Completion:
    """Accumulates one request's events into OpenAI objects and feeds its RequestTimer."""

    def __init__(self, req: ChatRequest, request_id: str, expires_s: int, timer: RequestTimer):
        self.req, self.id, self.timer = req, f"chatcmpl-{request_id}", timer
        self.audio_id = f"audio_{request_id}"
        self.created = int(time.time())
        self.expires_at = self.created + expires_s
        self.audio_format = req.audio.format if req.audio else "wav"
        self.with_text = "text" in req.output_modalities()
        self.text: list[str] = []
        self.transcript: list[str] = []
        self.pcm: list[np.ndarray] = []
        self.sample_rate = 24000
        self.finish_reason = "stop"
        self.usage: dict | None = None
        self.sent_header = False

    def absorb(self, event: dict, audio: np.ndarray | None) -> None:
        kind = event.get("type")
        if kind == "text.delta":
            self.text.append(event.get("text", ""))
            if event.get("text"):
                self.timer.text()
        elif kind == "audio.delta":
            self.transcript.append(event.get("transcript") or "")
            if audio is not None:
                self.sample_rate = int(event.get("sample_rate", self.sample_rate))
                self.pcm.append(audio)
                self.timer.audio(audio.size / self.sample_rate)
        elif kind == "done":
            self.finish_reason = event.get("finish_reason", "stop")
            self.usage = event.get("usage")

    def chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        return json.dumps({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.req.model, "system_fingerprint": None,
                           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]})

    def audio_delta(self, event: dict, audio: np.ndarray | None) -> dict:
        """delta.audio of one audio.delta event: the new audio (if any) and the new transcript text."""
        delta = {"id": self.audio_id, "expires_at": self.expires_at, "transcript": event.get("transcript") or ""}
        if audio is not None:
            data = audio_codec.pcm16(audio)
            if self.audio_format == "wav" and not self.sent_header:
                data, self.sent_header = audio_codec.streaming_wav_header(self.sample_rate) + data, True
            delta.update(data=base64.b64encode(data).decode(), sample_rate=self.sample_rate)
        return {"audio": delta}

    def usage_dict(self) -> dict:
        usage = dict(self.usage or {})
        usage.setdefault("prompt_tokens", 0)
        usage.setdefault("completion_tokens", 0)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def response(self) -> dict:
        """The chat.completion object (encodes the audio: CPU work, call it from a worker thread).

        With audio out, message.audio.transcript is the spoken text (the pipeline's per-chunk
        transcripts, else the text); content is null when text was not asked for, as at OpenAI."""
        text = "".join(self.text)
        message: dict = {"role": "assistant", "content": text if self.with_text else None, "refusal": None,
                         "annotations": []}
        if self.pcm:
            pcm = np.concatenate(self.pcm)
            data = audio_codec.encode(pcm, self.sample_rate, self.audio_format)
            message["audio"] = {"id": self.audio_id, "data": base64.b64encode(data).decode(),
                                "expires_at": self.expires_at, "transcript": "".join(self.transcript) or text}
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.req.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}],
                "usage": self.usage_dict()}


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatRequest, request: Request):
    """Extension fields the pipeline does not read (a 400 naming the field), validation and input decoding
    first, then admission (429 at once when the pipeline is full), then the pipeline. Every request, streamed
    or not, waits for its slot and the pipeline's first event before its head: the same request gets the
    same status whatever the load (a pipeline's rejection, or a queue wait past --max-queue-wait, is an HTTP
    status, never a 200 whose stream ends in an error event)."""
    cfg = config(request)
    pipeline = pipeline_for(request, req.model, CHAT, "chat completions")
    await refuse_unread_fields(request, pipeline, "/v1/chat/completions", extensions(req), ChatRequest.model_fields,
                               ROUTED_KEYS)
    body, tensors = await run_in_threadpool(to_pipeline, req, cfg.limits, pipeline.content)
    ticket = admission.enter(request, pipeline)
    request_id = request.state.request_id
    extra = tensors or None
    completion = Completion(req, request_id, cfg.audio_expires_s, observability.timer(request, pipeline.name))
    stream = generation.events(request, pipeline, body, request_id, extra, _FIELD_OF_KEY)

    if not req.stream:
        async def finish():
            completion.timer.done()
            return await run_in_threadpool(completion.response)
        return await generation.collect(request, ticket, stream, completion.absorb, finish)

    events = await generation.opened(request, ticket, stream)   # a rejection: before the head
    include_usage = bool(req.stream_options and req.stream_options.include_usage)

    async def sse():
        yield completion.chunk({"role": "assistant", "content": ""})
        async for event, audio in events:
            completion.absorb(event, audio)
            if event.get("type") == "text.delta" and event.get("text"):
                yield completion.chunk({"content": event["text"]})
            elif event.get("type") == "audio.delta" and (audio is not None or event.get("transcript")):
                yield completion.chunk(completion.audio_delta(event, audio))
        completion.timer.done()
        yield completion.chunk({}, completion.finish_reason)
        if include_usage:
            yield json.dumps({"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
                              "model": req.model, "choices": [], "usage": completion.usage_dict()})
        yield "[DONE]"

    return generation.sse_response(request, "/v1/chat/completions", request_id, sse(),
                                   lambda err: json.dumps(err.body()), stream)


@router.post("/v1/chat/completions/batch")
async def chat_completions_batch(batch: ChatBatchRequest, request: Request):
    """vLLM's batch chat: `messages` is a list of 1..ChatBatchRequest.MAX conversations, the other fields those of
    /v1/chat/completions (applied to each); answers one chat.completion whose choice `i` answers conversation `i`
    (usage summed, its nested details too). Not streamed (`stream: true` is a 400). The request limits
    (--max-messages, --max-text-chars, --max-audio-seconds, --max-images) hold for the batch as a whole, as for one
    request. Every conversation is checked before any runs, and any error, also the pipeline's, names its conversation
    (`messages[i]...`); the batch is one request of the pipeline's admission gate, its conversations run on that slot
    and the free ones (`omni_frontend.batching`); one conversation's failure fails the batch."""
    cfg = config(request)
    if batch.stream:
        raise bad_request("a batch is not streamed: its answer is one chat.completion", param="stream",
                          code="unsupported_parameter")
    if batch.stream_options is not None:
        raise bad_request("stream_options is only allowed when stream is true, and a batch is not streamed",
                          param="stream_options", code="unsupported_parameter")
    pipeline = pipeline_for(request, batch.model, CHAT, "chat completions")
    await refuse_unread_fields(request, pipeline, "/v1/chat/completions/batch", extensions(batch),
                               ChatRequest.model_fields, ROUTED_KEYS)
    reqs = [batch.model_copy(update={"messages": conversation}) for conversation in batch.messages]
    if (total := sum(len(req.messages) for req in reqs)) > cfg.limits.max_messages:
        raise bad_request(f"the batch has {total} messages in all; the limit is {cfg.limits.max_messages} for its "
                          "conversations together (--max-messages)", param="messages", code="too_many_messages")
    prepared, left = [], cfg.limits
    for i, req in enumerate(reqs):
        with _in_conversation(i), _within_batch_limits(i):
            body, tensors = await run_in_threadpool(to_pipeline, req, left, pipeline.content)
        texts = sum(len(part.get("text", "")) for m in body["messages"] for part in m["content"])
        audio, images = tensors.get("INPUT_AUDIO"), tensors.get("INPUT_IMAGES")
        left = dataclasses.replace(left, max_messages=left.max_messages - len(req.messages),
                                   max_text_chars=left.max_text_chars - texts,
                                   max_audio_seconds=left.max_audio_seconds - (
                                       0 if audio is None else audio.size / INPUT_SAMPLE_RATE),
                                   max_images=left.max_images - (0 if images is None else len(images)))
        prepared.append((body, tensors))
    ticket = admission.enter(request, pipeline)
    await pipeline_stream.until_disconnect(request, ticket.wait(request))
    request_id, timer = request.state.request_id, observability.timer(request, pipeline.name)

    async def answer(i: int) -> dict:
        body, tensors = prepared[i]
        completion = Completion(reqs[i], f"{request_id}-{i}", cfg.audio_expires_s, timer)
        extra = tensors or None
        with _in_conversation(i):
            async for event, audio in generation.events(request, pipeline, body, f"{request_id}-{i}", extra,
                                                        _FIELD_OF_KEY):
                completion.absorb(event, audio)
        return await run_in_threadpool(completion.response)

    answers = await pipeline_stream.until_disconnect(request, batching.run_items(ticket, len(reqs), answer))
    timer.done()
    return {**answers[0], "id": f"chatcmpl-{request_id}", "usage": _summed([a["usage"] for a in answers]),
            "choices": [{**a["choices"][0], "index": i} for i, a in enumerate(answers)]}


@contextlib.contextmanager
def _within_batch_limits(i: int):
    """A limit error of conversation `i` > 0 says that the limit holds for the batch's conversations together (the
    limit it names is what conversations 0..i-1 left of it)."""
    try:
        yield
    except APIError as exc:
        if i and exc.code in ("text_too_long", "audio_too_long", "too_many_images"):
            before = f"conversations 0-{i - 1}" if i > 1 else "conversation 0"
            exc.message = (f"{exc.message}: what {before} left of the limit, which holds for a batch's conversations "
                           "together")
        raise


@contextlib.contextmanager
def _in_conversation(i: int):
    """An APIError raised inside names conversation `i`: param `messages...` becomes `messages[i]...`; otherwise
    (another field, or none) its message starts with "conversation i: "."""
    try:
        yield
    except APIError as exc:
        if exc.param and exc.param.startswith("messages"):
            exc.param = f"messages[{i}]{exc.param[len('messages'):]}"
        else:
            exc.message = f"conversation {i}: {exc.message}"
        raise


def _summed(usages: list[dict]) -> dict:
    """The sum of usage objects, key by key (nested detail objects too; keys missing from some count 0 there)."""
    total: dict = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, dict):
                total[key] = _summed([total.get(key) or {}, value])
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return total
