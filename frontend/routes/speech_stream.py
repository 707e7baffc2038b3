"""WS /v1/audio/speech/stream: text in as it is written (an LLM's deltas), speech out sentence by sentence, many
utterances on one connection (vLLM-Omni's streaming-text TTS protocol) over a speech pipeline (e.g. `tts`).

Client -> server, JSON text frames (each at most MAX_MESSAGE_CHARS characters):
  {"type": "session.config", "model", "voice", "response_format", "speed", "stream_audio", "split_granularity"}
      first, within CONFIG_TIMEOUT_S; again between utterances to change the fields it names (the others keep their
      values, as OpenAI's session.update; null: the default; refused while text is buffered).
      model: a speech pipeline (default: the `?model=` query, else the first speech pipeline); voice: a voice of
      it, checked now (default: its default); response_format: wav (default), pcm, flac, mp3, opus, aac; speed:
      0.25-4 (1); stream_audio (false): PCM16 frames as the pipeline speaks them (pcm, or wav: a streaming WAV
      header first) instead of one whole file per sentence; split_granularity: "sentence" (default: a sentence
      is spoken as soon as it is complete, "Sure!" too), "clause" (the first chunk after 2-3 words, then growing:
      omni_backends.voice.chunker, as the voice pipeline speaks an LLM's answer) or "utterance" (the text
      buffered at input.done as one request: vLLM-Omni's current behaviour). Any other field is an error naming it.
  {"type": "input.text", "text": str}   more text of the current utterance
  {"type": "input.done"}                 the utterance ends: its rest is spoken; the connection stays open
  {"type": "session.close"}              the utterance under way ends as with input.done, what is queued is
                                         spoken, then the server closes (1000); later messages are refused
Server -> client, in order per utterance (utterance_index counts input.done flushes, sentence_index within one):
  {"type": "audio.start", "utterance_index", "sentence_index", "sentence_text", "format", "sample_rate"} (the
      pipeline's rate, Hz: that of PCM frames; Kokoro 24000)
  binary frames: the sentence's audio (stream_audio: PCM16 pieces; else one file in response_format)
  {"type": "audio.done", "utterance_index", "sentence_index", "total_bytes", "error": bool}
  {"type": "session.done", "utterance_index", "total_sentences"}
  {"type": "error", "message", "code", "param"} (+ "utterance_index", "sentence_index", "partial_audio" for a
      sentence that failed); the connection goes on, except before a valid session.config (then it closes 1008).
Each sentence is one request of the pipeline through its admission gate (a full pipeline fails that sentence
with `pipeline_overloaded`); sentences are spoken one at a time, in order, while more text arrives. At most
max_speech_input_chars characters (--max-speech-input-chars) may wait to be spoken; more is refused
(`input_too_long`: the client is sending faster than speech is made). A sentence with nothing to say (e.g. Markdown
that strips to nothing, or letters the voice cannot read: the pipeline's 400 `nothing_to_speak`) is a valid file of
10 ms of silence (raw PCM: no frames). A connection with no message for
IDLE_TIMEOUT_S counted from the later of its last message and the end of the last sentence spoken gets an
`idle_timeout` error and is closed (1000); a client that leaves, also after session.close, has its sentence
cancelled in Triton at once. Authentication as the realtime WebSocket (`omni_frontend.auth.websocket_authorized`;
the handshake names the key subprotocol a browser offered).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from typing import Literal

import numpy as np
from fastapi import APIRouter, WebSocket
from pydantic import ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from omni_backends.errors import NOTHING_TO_SPEAK
from omni_backends.voice.chunker import SentenceChunker
from omni_frontend import audio as audio_codec
from omni_frontend import client_text
from omni_frontend import pipeline_stream
from omni_frontend.auth import accepted_subprotocol, offered_subprotocols, websocket_authorized
from omni_frontend.chat_protocol import Voice
from omni_frontend.errors import APIError
from omni_frontend.observability import RequestTimer, request_id_of
from omni_frontend.pipelines import SPEECH, Pipeline
from omni_frontend.routes.speech import stream_encoder
from omni_frontend.validation import RequestModel

router = APIRouter()
log = logging.getLogger("omni_frontend.speech_stream")
CONFIG_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 30.0
MAX_MESSAGE_CHARS = 128 * 1024
NORMAL_CLOSURE, POLICY_VIOLATION = 1000, 1008
_CLOSE = object()


class StreamConfig(RequestModel):
    """A session.config message (without its type)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    voice: Voice | None = None
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus", "aac"] = "wav"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_audio: bool = False
    split_granularity: Literal["sentence", "clause", "utterance"] = "sentence"


@dataclasses.dataclass
class Sentence:
    """One piece of text to speak, with the config in force when it was split off."""

    text: str
    utterance: int
    index: int
    config: StreamConfig
    pipeline: Pipeline


@dataclasses.dataclass
class UtteranceDone:
    utterance: int
    sentences: int


class ConnectionGone(Exception):
    """A frame could not be sent: the client has gone (or the socket is closed)."""


class StreamError(Exception):
    """A refused client message: its `error` event. `fatal`: the connection closes after it."""

    def __init__(self, message: str, code: str, param: str | None = None, fatal: bool = False):
        super().__init__(message)
        # bounded as the HTTP routes' errors are (errors.APIError): they quote client input
        message, param = client_text.error_text(message, param)
        self.event = {"type": "error", "message": message, "code": code, "param": param}
        self.fatal = fatal


class SpeechStream:
    """One connection: reads client messages, splits the text, and speaks the sentences in order on its own task."""

    def __init__(self, websocket: WebSocket, request_id: str):
        self.websocket, self.request_id = websocket, request_id
        state = websocket.app.state
        self.cfg, self.triton, self.control, self.admission = state.config, state.triton, state.control, state.admission
        self.metrics = state.metrics
        self.config: StreamConfig | None = None
        self.pipeline: Pipeline | None = None
        self.chunker: SentenceChunker | None = None
        self.buffered = ""            # the current utterance's text not yet split off (utterance granularity: all)
        self.utterance, self.sentence = 0, 0
        self.pending_chars = 0        # characters split off and not yet spoken
        self.queue: asyncio.Queue = asyncio.Queue()
        self.speaking = False
        self.idle_since = time.monotonic()   # the last client message, or the end of the last sentence spoken
        self.config_fields: dict = {}        # the session.config fields set so far (a later one updates them)
        self.send_lock = asyncio.Lock()

    async def send_json(self, event: dict) -> None:
        await self._send(self.websocket.send_text, json.dumps(event))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(self.websocket.send_bytes, data)

    async def _send(self, send, payload) -> None:
        """One frame; the speaking task and the reading one both send. Raises ConnectionGone when it cannot."""
        async with self.send_lock:
            try:
                await send(payload)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise ConnectionGone(str(exc)) from exc

    def unsplit(self) -> str:
        """The current utterance's text that no sentence holds yet."""
        return self.chunker.buffered() if self.chunker is not None else self.buffered

    async def run(self) -> None:
        """Reads messages until the client leaves, closes, or is closed; the socket is read also while a
        session.close is being served, so that a client leaving then cancels what is being spoken."""
        speaker = asyncio.create_task(self._speak_all())
        closing = False
        try:
            while True:
                receiving = asyncio.ensure_future(self._receive())
                await asyncio.wait({receiving, speaker}, return_when=asyncio.FIRST_COMPLETED)
                if not receiving.done():   # the speaker ended: all was spoken after session.close, or a send failed
                    receiving.cancel()
                    await asyncio.gather(receiving, return_exceptions=True)
                    if closing and speaker.exception() is None:
                        await self.websocket.close(NORMAL_CLOSURE)
                    return
                try:
                    message = receiving.result()
                    if message is None:   # the client went away
                        return
                    if closing:
                        raise StreamError("the session is closing (session.close): no more messages are read",
                                          "session_closing")
                    if await self._handle(message) is _CLOSE:
                        closing = True
                        await self.queue.put(_CLOSE)
                except StreamError as exc:
                    await self.send_json(exc.event)
                    if exc.fatal:
                        await self.websocket.close(POLICY_VIOLATION if self.config is None else NORMAL_CLOSURE)
                        return
        finally:
            speaker.cancel()
            (ended,) = await asyncio.gather(speaker, return_exceptions=True)
            if isinstance(ended, Exception) and not isinstance(ended, (ConnectionGone, WebSocketDisconnect)):
                log.error("speech stream %s: speaking failed", self.request_id, exc_info=ended)

    async def _receive(self) -> dict | None:
        """The next client message as a JSON object; None when the client disconnected. Raises StreamError for a
        frame that is not one, and (fatal) when no message came in time: CONFIG_TIMEOUT_S for the first
        session.config, IDLE_TIMEOUT_S later while nothing is queued or being spoken."""
        while True:
            if self.config is None:
                timeout = CONFIG_TIMEOUT_S
            elif self.speaking or self.queue.qsize():
                timeout = IDLE_TIMEOUT_S   # never idle while speaking: looked at again after this
            else:
                timeout = IDLE_TIMEOUT_S - (time.monotonic() - self.idle_since)
                if timeout <= 0:
                    raise StreamError(f"no message for {IDLE_TIMEOUT_S:g} s while nothing was spoken",
                                      "idle_timeout", fatal=True)
            try:
                frame = await asyncio.wait_for(self.websocket.receive(), timeout)
                break
            except asyncio.TimeoutError:
                if self.config is None:
                    raise StreamError(f"no session.config within {CONFIG_TIMEOUT_S:g} s", "config_timeout",
                                      fatal=True) from None
        self.idle_since = time.monotonic()
        if frame["type"] == "websocket.disconnect":
            return None
        text = frame.get("text")
        if text is None:
            raise StreamError("messages are JSON text frames (binary frames are not read)", "invalid_message")
        if len(text) > MAX_MESSAGE_CHARS:
            raise StreamError(f"message of {len(text)} characters is over the limit of {MAX_MESSAGE_CHARS}",
                              "message_too_large")
        try:
            message = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StreamError(f"message is not JSON: {exc}", "invalid_json") from None
        if not isinstance(message, dict):
            raise StreamError("messages must be JSON objects", "invalid_message")
        return message

    async def _handle(self, message: dict):
        kind = message.get("type")
        if kind == "session.config":
            return await self._configure({k: v for k, v in message.items() if k != "type"})
        if self.config is None:
            raise StreamError(f"expected session.config first, got {kind!r}", "session_config_required",
                              param="type", fatal=True)
        if kind == "input.text":
            text = message.get("text")
            if not isinstance(text, str):
                raise StreamError("input.text needs a string 'text'", "invalid_value", param="text")
            waiting = self.pending_chars + len(self.unsplit()) + len(text)
            limit = self.cfg.limits.max_speech_input_chars
            if waiting > limit:
                raise StreamError(f"{waiting} characters would wait to be spoken; the limit is {limit} "
                                  "(--max-speech-input-chars): send text as fast as it is spoken", "input_too_long",
                                  param="text")
            if self.chunker is None:
                self.buffered += text
            else:
                await self._split(self.chunker.feed(text))
        elif kind == "input.done":
            await self._end_utterance()
        elif kind == "session.close":
            if self.unsplit().strip():   # an utterance under way ends as input.done would end it
                await self._end_utterance()
            return _CLOSE
        else:
            raise StreamError(f"unknown message type {kind!r} (session.config, input.text, input.done, "
                              "session.close)", "unknown_message_type", param="type")
        return None

    async def _end_utterance(self) -> None:
        rest = self.chunker.flush() if self.chunker is not None else [t for t in [self.buffered.strip()] if t]
        self.buffered = ""
        await self._split(rest)
        await self.queue.put(UtteranceDone(self.utterance, self.sentence))
        self.utterance, self.sentence = self.utterance + 1, 0

    async def _configure(self, update: dict) -> None:
        """Validates a session.config over the fields set so far (a field it does not name keeps its value; null:
        the default), the voice by the pipeline itself, before anything changes."""
        first = self.config is None
        if self.unsplit().strip():
            raise StreamError("session.config cannot change the session while text is buffered: send input.done "
                              "first", "input_buffered")
        fields = {**self.config_fields, **update}
        try:
            config = StreamConfig.model_validate(fields)
        except ValidationError as exc:
            error = exc.errors()[0]
            param = ".".join(str(p) for p in error["loc"]) or None
            raise StreamError(f"invalid session.config: {param}: {error['msg']}", "invalid_value", param=param,
                              fatal=first) from None
        if config.stream_audio and config.response_format not in audio_codec.STREAMABLE:
            raise StreamError("stream_audio needs response_format 'pcm' or 'wav'", "invalid_value",
                              param="response_format", fatal=first)
        model = config.model or self.websocket.query_params.get("model")
        pipeline = self.cfg.pipeline(model, SPEECH) if model else next(
            (p for p in self.cfg.pipelines if p.kind == SPEECH), None)
        if pipeline is None:
            served = ", ".join(p.name for p in self.cfg.pipelines if p.kind == SPEECH) or "none"
            raise StreamError(f"model {model!r} is not a speech pipeline; speech models: {served}", "model_not_found",
                              param="model", fatal=first)
        try:
            self.control.check(pipeline)
            event = await pipeline_stream.voices(self.triton, pipeline.entry, self.request_id, config.voice)
        except APIError as exc:
            raise StreamError(exc.message, exc.code or "invalid_value", param=exc.param, fatal=first) from None
        if config.voice is None and event is not None:
            config = config.model_copy(update={"voice": event.get("default")})
        elif event is not None:
            config = config.model_copy(update={"voice": event.get("voice", config.voice)})
        self.config, self.pipeline, self.config_fields = config, pipeline, fields
        self.chunker = {"sentence": SentenceChunker(clauses=False, min_words=1), "clause": SentenceChunker(),
                        "utterance": None}[config.split_granularity]

    async def _split(self, texts: list[str]) -> None:
        for text in texts:
            self.pending_chars += len(text)
            await self.queue.put(Sentence(text, self.utterance, self.sentence, self.config, self.pipeline))
            self.sentence += 1

    async def _speak_all(self) -> None:
        while (item := await self.queue.get()) is not _CLOSE:
            if isinstance(item, UtteranceDone):
                await self.send_json({"type": "session.done", "utterance_index": item.utterance,
                                      "total_sentences": item.sentences})
                continue
            self.speaking = True
            try:
                await self._speak(item)
            finally:
                self.speaking, self.idle_since = False, time.monotonic()
                self.pending_chars -= len(item.text)

    async def _speak(self, sentence: Sentence) -> None:
        """One sentence: audio.start (with the pipeline's sample rate: sent with the first audio, or before the
        error or the end when none came), its audio, audio.done; a failure is an error event (the session goes on)."""
        config, ids = sentence.config, {"utterance_index": sentence.utterance, "sentence_index": sentence.index}
        started = False

        async def start(rate: int) -> None:
            nonlocal started
            if not started:
                started = True
                await self.send_json({"type": "audio.start", **ids, "sentence_text": sentence.text,
                                      "format": config.response_format, "sample_rate": rate})

        total, failed, ticket, rate = 0, False, None, 24000
        timer = RequestTimer(self.metrics, sentence.pipeline.name, time.perf_counter())
        try:
            self.control.check(sentence.pipeline)
            ticket = self.admission.gate(sentence.pipeline.name).enter()
            await ticket.wait()
            body = {"input": sentence.text, "voice": config.voice, "speed": config.speed}
            encode = stream_encoder(config.response_format) if config.stream_audio else None
            pcm = []
            # closed on any exit (a failed send, a cancellation): that cancels the Triton request at once
            async with contextlib.aclosing(pipeline_stream.events(
                    self.triton, sentence.pipeline.entry, body,
                    f"{self.request_id}-{sentence.utterance}-{sentence.index}")) as events:
                try:
                    async for event, audio in events:
                        if event.get("type") != "audio.delta" or audio is None:
                            continue
                        rate = int(event.get("sample_rate", rate))
                        await start(rate)
                        timer.audio(audio.size / rate)
                        if encode is None:
                            pcm.append(audio)
                        else:
                            data = encode(audio, rate)
                            await self.send_bytes(data)
                            total += len(data)
                except APIError as exc:
                    if exc.code != NOTHING_TO_SPEAK:   # a sentence with nothing to say is the silence below
                        raise
            await start(rate)
            if encode is None:
                data = await run_in_threadpool(audio_codec.encode, np.concatenate(pcm) if pcm else
                                               np.zeros(0, np.float32), rate, config.response_format)
                await self.send_bytes(data)
                total = len(data)
            timer.done()
        except ConnectionGone:
            raise
        except Exception as exc:  # noqa: BLE001 - a pipeline refusal, or our own failure: this sentence only
            failed = True
            if not isinstance(exc, APIError):
                log.exception("speech stream %s: sentence %s-%s failed", self.request_id, sentence.utterance,
                              sentence.index)
                exc = APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error")
            await start(rate)
            await self.send_json({"type": "error", "message": exc.message, "code": exc.code or "pipeline_error",
                                  "param": exc.param, **ids, "partial_audio": total > 0})
        finally:
            if ticket is not None:
                ticket.release()
        await self.send_json({"type": "audio.done", **ids, "total_bytes": total, "error": failed})


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket):
    protocols = offered_subprotocols(websocket)
    await websocket.accept(subprotocol=accepted_subprotocol(protocols))
    if not websocket_authorized(websocket, websocket.app.state.config.api_key, protocols):
        await websocket.send_text(json.dumps({"type": "error", "message": "invalid or missing API key "
                                              "(Authorization: Bearer ...)", "code": "invalid_api_key", "param": None}))
        await websocket.close(POLICY_VIOLATION)
        return
    request_id = request_id_of(websocket.headers.get("x-request-id"))
    log.info("speech stream %s opened", request_id)
    try:
        await SpeechStream(websocket, request_id).run()
    except (WebSocketDisconnect, ConnectionGone):
        pass
    except Exception:  # noqa: BLE001 - a broken socket ends this connection only
        log.exception("speech stream %s ended with an error", request_id)
    finally:
        log.info("speech stream %s closed", request_id)
