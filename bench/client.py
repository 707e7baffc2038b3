"""The four workloads as HTTP calls to the OpenAI-compatible frontend; each returns a RequestRecord.

  chat           POST /v1/chat/completions, stream, modalities ["text"]
  chat-audio     POST /v1/chat/completions, stream, modalities ["text", "audio"] (PCM16 with --voice,
                 else the server's default voice and streamed WAV)
  speech         POST /v1/audio/speech, stream_format "sse", response_format "wav"
  transcription  POST /v1/audio/transcriptions (multipart WAV), response_format "json"
  images         POST /v1/images/generations, response_format "b64_json", png, size and steps of the
                 options, seed = prompt index, n 1
  videos         POST /v1/videos (size, num_frames and steps of the options, VIDEO_GUIDANCE, seed = prompt
                 index), then GET /v1/videos/{id} every VIDEO_POLL_S until completed (a chunk per progress
                 change; E2E = time to completed), then DELETE (not timed)
Arrival times are taken as each SSE `data:` line is read. No model code.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import json
import struct
import time
from collections.abc import AsyncIterator

import httpx

from omni_bench.records import AUDIO, IMAGE, OTHER, TEXT, RequestRecord

WORKLOADS = ("chat", "chat-audio", "speech", "transcription", "images", "videos")
ENDPOINTS = {"chat": "/v1/chat/completions", "chat-audio": "/v1/chat/completions",
             "speech": "/v1/audio/speech", "transcription": "/v1/audio/transcriptions",
             "images": "/v1/images/generations", "videos": "/v1/videos"}
VIDEO_POLL_S = 0.02
VIDEO_GUIDANCE = {"guidance_scale": 4.0, "guidance_scale_2": 3.0}  # the wan model's defaults, sent explicitly

DEFAULT_SPEECH_VOICE = "alloy"


@dataclasses.dataclass(frozen=True)
class RequestOptions:
    """What every request of a run shares.

    model / endpoint: OpenAI model id and route; voice: output voice (None: the server's default);
    max_tokens: chat completion limit; extra_body: merged last into JSON bodies (so it can override
    `temperature`, which defaults to 0 for reproducible answers); audio: WAV bytes per prompt index
    for transcription; size ("WxH") and steps: images and videos workloads; frames: videos (num_frames).
    """

    workload: str
    model: str | None
    endpoint: str
    voice: str | None = None
    max_tokens: int | None = None
    extra_body: dict = dataclasses.field(default_factory=dict)
    audio: tuple[bytes, ...] = ()
    size: str = "64x64"
    steps: int = 4
    frames: int = 17


class StreamError(RuntimeError):
    """An error status or an error event in a response."""


def decode_audio_packet(data: bytes) -> tuple[bytes, int | None]:
    """PCM16 payload of one audio packet and the sample rate its WAV header states (None without one).

    A streamed WAV's first packet starts with a RIFF header; its `fmt ` chunk gives the rate and the
    PCM follows the `data` chunk header. Other packets are raw little-endian 16-bit mono PCM.
    """
    if not data.startswith(b"RIFF"):
        return data, None
    pos, rate = 12, None
    while pos + 8 <= len(data):
        tag, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if tag == b"fmt ":
            rate = struct.unpack("<I", data[pos + 12:pos + 16])[0]
        elif tag == b"data":
            return data[pos + 8:], rate
        pos += 8 + size
    raise StreamError("WAV header without a data chunk")


def text_tokens(usage: dict) -> int | None:
    """Generated text tokens of an OpenAI `usage`: `completion_tokens_details.text_tokens` when the server
    splits it (audio-out pipelines count codec tokens in `completion_tokens`), else `completion_tokens`."""
    split = (usage.get("completion_tokens_details") or {}).get("text_tokens")
    return split if split is not None else usage.get("completion_tokens")


async def _sse(response: httpx.Response) -> AsyncIterator[tuple[float, str]]:
    """(perf_counter time, payload) of each SSE `data:` line of a successful response."""
    if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")
        raise StreamError(f"HTTP {response.status_code}: {body[:500]}")
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            yield time.perf_counter(), line[5:].strip()


def _event(payload: str) -> dict:
    event = json.loads(payload)
    if "error" in event or event.get("type") == "error":
        raise StreamError(f"error event: {json.dumps(event)[:500]}")
    return event


def _add_audio(record: RequestRecord, t: float, data: bytes, rate: int | None) -> None:
    pcm, header_rate = decode_audio_packet(data)
    record.sample_rate = header_rate or rate or record.sample_rate
    record.add(t, AUDIO, len(data), len(pcm) // 2)


async def _chat(client: httpx.AsyncClient, options: RequestOptions, record: RequestRecord, sent: float) -> None:
    body: dict = {"model": options.model, "messages": [{"role": "user", "content": record.prompt}], "stream": True,
                  "stream_options": {"include_usage": True}, "temperature": 0.0, "max_tokens": options.max_tokens}
    if options.workload == "chat-audio":
        body["modalities"] = ["text", "audio"]
        if options.voice:
            body["audio"] = {"voice": options.voice, "format": "pcm16"}
    else:
        body["modalities"] = ["text"]
    body = {k: v for k, v in {**body, **options.extra_body}.items() if v is not None}
    text = []
    async with client.stream("POST", options.endpoint, json=body) as response:
        async for arrived, payload in _sse(response):
            t = arrived - sent
            if payload == "[DONE]":
                record.add(t, OTHER)
                continue
            chunk = _event(payload)
            if chunk.get("usage"):
                record.completion_tokens = text_tokens(chunk["usage"])
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            if delta.get("content"):
                text.append(delta["content"])
                record.add(t, TEXT, len(delta["content"]))
            elif (delta.get("audio") or {}).get("data"):
                _add_audio(record, t, base64.b64decode(delta["audio"]["data"]), delta["audio"].get("sample_rate"))
            else:
                record.add(t, OTHER)
    record.text = "".join(text)


async def _speech(client: httpx.AsyncClient, options: RequestOptions, record: RequestRecord, sent: float) -> None:
    body = {"model": options.model, "input": record.prompt, "voice": options.voice or DEFAULT_SPEECH_VOICE,
            "response_format": "wav", "stream_format": "sse", **options.extra_body}
    body = {k: v for k, v in body.items() if v is not None}
    async with client.stream("POST", options.endpoint, json=body) as response:
        async for arrived, payload in _sse(response):
            event = _event(payload)
            if event.get("type") == "speech.audio.delta":
                _add_audio(record, arrived - sent, base64.b64decode(event["audio"]), None)
            else:
                record.add(arrived - sent, OTHER)


async def _transcription(client: httpx.AsyncClient, options: RequestOptions, record: RequestRecord,
                         sent: float) -> None:
    wav = options.audio[record.index % len(options.audio)]
    form = {"response_format": "json", **{k: str(v) for k, v in options.extra_body.items()}}
    if options.model:
        form["model"] = options.model
    response = await client.post(options.endpoint, files={"file": ("audio.wav", wav, "audio/wav")}, data=form)
    arrived = time.perf_counter()
    if response.status_code != 200:
        raise StreamError(f"HTTP {response.status_code}: {response.text[:500]}")
    import soundfile as sf

    record.text = response.json()["text"]
    record.input_audio_s = sf.info(io.BytesIO(wav)).duration
    record.add(arrived - sent, OTHER, len(record.text))


async def _images(client: httpx.AsyncClient, options: RequestOptions, record: RequestRecord, sent: float) -> None:
    body = {"model": options.model, "prompt": record.prompt, "size": options.size, "n": 1,
            "response_format": "b64_json", "seed": record.index, "num_inference_steps": options.steps,
            **options.extra_body}
    response = await client.post(options.endpoint, json={k: v for k, v in body.items() if v is not None})
    arrived = time.perf_counter()
    if response.status_code != 200:
        raise StreamError(f"HTTP {response.status_code}: {response.text[:500]}")
    for item in response.json()["data"]:
        record.add(arrived - sent, IMAGE, len(base64.b64decode(item["b64_json"])))
        record.images += 1


async def _videos(client: httpx.AsyncClient, options: RequestOptions, record: RequestRecord, sent: float) -> None:
    body = {"model": options.model, "prompt": record.prompt, "size": options.size, "num_frames": options.frames,
            "num_inference_steps": options.steps, "seed": record.index, **VIDEO_GUIDANCE, **options.extra_body}
    response = await client.post(options.endpoint, json={k: v for k, v in body.items() if v is not None})
    if response.status_code != 200:
        raise StreamError(f"HTTP {response.status_code}: {response.text[:500]}")
    video, progress = response.json(), -1
    try:
        while video["status"] in ("queued", "in_progress"):
            if video["progress"] != progress:
                progress = video["progress"]
                record.add(time.perf_counter() - sent, OTHER, progress)
            await asyncio.sleep(VIDEO_POLL_S)
            response = await client.get(f"{options.endpoint}/{video['id']}")
            if response.status_code != 200:
                raise StreamError(f"HTTP {response.status_code}: {response.text[:500]}")
            video = response.json()
        if video["status"] != "completed":
            raise StreamError(f"video {video['id']} {video['status']}: {video.get('error')}")
        record.add(time.perf_counter() - sent, OTHER, 100)
        record.video_frames = int(video["num_frames"])
    finally:
        with contextlib.suppress(httpx.HTTPError):
            await client.delete(f"{options.endpoint}/{video['id']}")


_SENDERS = {"chat": _chat, "chat-audio": _chat, "speech": _speech, "transcription": _transcription,
            "images": _images, "videos": _videos}


async def send(client: httpx.AsyncClient, options: RequestOptions, index: int, prompt: str,
               run_start: float) -> RequestRecord:
    """Send one request of `options.workload` and record it; failures end up in `record.error`."""
    record = RequestRecord(index=index, prompt=prompt)
    sent = time.perf_counter()
    record.send_time = sent - run_start
    try:
        await _SENDERS[options.workload](client, options, record, sent)
    except (httpx.HTTPError, StreamError, ValueError, KeyError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    return record


async def synthesize_inputs(client: httpx.AsyncClient, prompts: list[str], model: str | None,
                            voice: str | None) -> tuple[bytes, ...]:
    """WAV clips of `prompts` spoken by the server's speech endpoint (transcription input; not timed).

    Raises StreamError when the server has no speech pipeline (pass --audio-file instead).
    """
    clips: dict[str, bytes] = {}
    for prompt in prompts:
        if prompt in clips:
            continue
        body = {"input": prompt, "voice": voice or DEFAULT_SPEECH_VOICE, "response_format": "wav"}
        if model:
            body["model"] = model
        response = await client.post("/v1/audio/speech", json=body)
        if response.status_code != 200:
            raise StreamError(f"could not synthesize transcription input through /v1/audio/speech "
                              f"(HTTP {response.status_code}: {response.text[:300]}); pass --audio-file")
        clips[prompt] = response.content
    return tuple(clips[p] for p in prompts)


def read_wav(path: str) -> bytes:
    """A WAV file's bytes, checked to be readable audio (raises ValueError otherwise)."""
    import soundfile as sf

    data = open(path, "rb").read()
    try:
        sf.info(io.BytesIO(data))
    except RuntimeError as exc:
        raise ValueError(f"{path} is not a readable audio file: {exc}") from exc
    return data

