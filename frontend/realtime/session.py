"""One `/v1/realtime` WebSocket session: client events in, server events out (OpenAI Realtime GA).

Three kinds of work run next to the receive loop, each an asyncio task:
- the VAD feeder sends appended audio (16 kHz) to the session's sequence on the VAD model and turns its
  speech_started / speech_stopped events into commits, barge-ins and automatic responses;
- one transcription task per committed audio item (the ASR stage), emitting the input transcription events;
- at most one response task: the chat pipeline (e.g. `voice`: LLM -> TTS) over one gRPC stream, mapped to
  response.* events. A response is a request of its pipeline like an HTTP one: a sleeping pipeline fails it
  (`pipeline_sleeping`), and it holds a slot of the pipeline's admission gate while it runs (it may queue;
  a full gate fails it with `pipeline_overloaded` / `queue_timeout`, as HTTP gets 429). Cancelling it
  (response.cancel, barge-in, disconnect) cancels the gRPC stream, so Triton cancels every stage. However it
  ends (completed, cancelled, failed), the content part and item it opened are closed (`*.done` events,
  item status `incomplete` unless completed) and `response.done` follows with the usage so far;
- at most one speculation (`speculation.py`): a turn's transcription and response started at a pause in
  the speech (`speech_paused`), events held, only when a slot of the gate is free at once (it holds that
  slot); adopted by the turn's commit (the response takes over its slot) or abandoned (the slot is freed).
Every server event goes through `send`, one at a time, so each task's events keep their order.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import logging

import numpy as np

from omni_frontend import pipeline_stream
from omni_frontend.admission import Gate, Ticket
from omni_frontend.config import RequestLimits
from omni_frontend.errors import APIError
from omni_frontend.model_control import ModelControl
from omni_frontend.pipelines import Pipeline
from omni_frontend.realtime import config as session_config
from omni_frontend.realtime.audio import STAGE_RATE, InputDecoder, OutputEncoder, b64decode, stage_audio_as
from omni_frontend.realtime.conversation import (HISTORY_CHARS, MAX_CHARS, Conversation, Item, Part, item_from_client,
                                                 truncate)
from omni_frontend.realtime.protocol import ProtocolError, decode, encode, error_event, new_id
from omni_frontend.realtime.speculation import Speculation
from omni_frontend.realtime.stages import VADSequence, transcribe
from omni_frontend.triton_client import TritonClient

log = logging.getLogger("omni_frontend.realtime")
MAX_APPEND_BYTES = 10 * 1024 * 1024  # decoded audio per append event (its base64 stays under uvicorn's 16 MiB frame limit)
MAX_APPEND_S = MAX_APPEND_BYTES / (2 * 24000)  # ~218 s: PCM16's 10 MiB at 24 kHz, the bound of every input format
MAX_BUFFER_S = 600  # uncommitted input audio kept at most
MAX_ITEM_AUDIO_S = 600  # the input_audio parts of one conversation.item.create in all (as --max-audio-seconds)
INLINE_DECODE_S = 1.0  # longer payloads are decoded on a worker thread, not in the event loop every client shares
MIN_COMMIT_MS = 100  # OpenAI: a commit needs at least 100 ms of audio
VAD_MAX_S = 5  # audio per VAD request at most: a long append is scored in pieces, other sessions' in between
# client events that change no state a speculation depends on (every other one abandons it)
_KEEPS_SPECULATION = ("input_audio_buffer.append", "conversation.item.retrieve")
# the most words of a spoken response's first chunk (the pipeline REQUEST's `first_chunk_words`; chat's default is
# 3): the first audio of a turn waits for one LLM token and ~0.1 s of Kokoro rendering less (docs/benchmarks.md)
FIRST_CHUNK_WORDS = 2


def usage_wire(usage: dict | None) -> dict:
    """A response's `usage` (Realtime wire) from a pipeline event's {"prompt_tokens", "completion_tokens"} (the
    counts so far, or in all on `done`; missing counts are 0)."""
    prompt, completion = (usage or {}).get("prompt_tokens", 0), (usage or {}).get("completion_tokens", 0)
    return {"total_tokens": prompt + completion, "input_tokens": prompt, "output_tokens": completion,
            "input_token_details": {"text_tokens": prompt, "audio_tokens": 0, "cached_tokens": 0},
            "output_token_details": {"text_tokens": completion, "audio_tokens": 0}}


class Response:
    """The state of one response while it runs (`settings`: session_config.response_settings of its spec;
    event_id: that of the client's response.create, named by the error event if it fails; None when the server
    started it). ticket: its slot (or queue place) of the pipeline's admission gate once it has one; usage: the
    Realtime usage so far (usage_wire)."""

    def __init__(self, spec: dict, settings: session_config.ResponseSettings, event_id: str | None = None):
        self.id, self.event_id = new_id("resp"), event_id
        self.spec, self.settings = spec, settings
        self.audio_out, self.voice, self.instructions = settings.audio_out, settings.voice, settings.instructions
        self.max_tokens, self.in_conversation = settings.max_tokens, settings.in_conversation
        self.item: Item | None = None
        self.reason = "client_cancelled"
        self.usage = usage_wire(None)
        self.task: asyncio.Task | None = None
        self.adopted: Speculation | None = None  # the speculation whose pipeline events it streams
        self.ticket: Ticket | None = None
        self.ending = False  # _respond is closing it: a cancel comes too late (it would cut the closing events)

    def release(self) -> None:
        """Frees its admission slot or queue place (idempotent)."""
        if self.ticket is not None:
            self.ticket.release()

    def wire(self, status: str, details: dict | None = None) -> dict:
        return {"object": "realtime.response", "id": self.id, "status": status, "status_details": details,
                "output": [self.item.wire()] if self.item else [],
                "conversation_id": "conv_default" if self.in_conversation else None,
                "output_modalities": ["audio" if self.audio_out else "text"], "max_output_tokens": self.max_tokens or "inf",
                "audio": {"output": {"format": session_config.format_wire(self.settings.output_format,
                                                                          self.settings.output_rate),
                                     "voice": self.voice}}, "usage": self.usage,
                "metadata": self.spec.get("metadata")}


class RealtimeSession:
    """Serves one accepted WebSocket. `send_text(str)` writes a frame; `run(receive)` reads client frames
    until the client leaves, then `close()` stops every task and ends the VAD sequence.

    speculation_ms: with server VAD and automatic responses, start a turn's response after this many ms of
    silence (the VAD's pause_duration_ms; used when shorter than the turn's silence_duration_ms), held until
    the turn ends; None: off. outcomes: the speculations counter (FrontendMetrics.speculations) or None.
    max_text_chars: the longest instructions (session or response), transcription prompt and text part of a
    conversation item a session may set (--max-text-chars). gate: the pipeline's admission gate
    (`Admission.gate`); control: the server's ModelControl (sleeping pipelines)."""

    def __init__(self, triton: TritonClient, pipeline: Pipeline, model: str, send_text, request_id: str, gate: Gate,
                 control: ModelControl, speculation_ms: int | None = None, outcomes=None,
                 max_text_chars: int = RequestLimits.max_text_chars):
        self.triton, self.pipeline, self.model, self._send_text = triton, pipeline, model, send_text
        self.request_id, self.gate, self.control = request_id, gate, control
        self.speculation_ms, self.outcomes, self.max_text_chars = speculation_ms, outcomes, max_text_chars
        self.speculation: tuple[Speculation, Response] | None = None
        self.session = session_config.default_session(model, new_id("sess"))
        self.settings = session_config.validate(self.session, max_text_chars=max_text_chars)
        self.conversation = Conversation(max_chars=max(MAX_CHARS, max_text_chars))
        self.decoder = InputDecoder(self.settings.input_format, self.settings.input_rate)
        self.buffer: list[np.ndarray] = []  # uncommitted input audio, float32 16 kHz
        self.buffer_start = 0  # absolute 16 kHz sample index of the buffer's first sample
        self.appended = 0  # 16 kHz samples appended in the whole session
        self.vad: VADSequence | None = None
        self.vad_origin = 0  # absolute sample index of the VAD sequence's sample 0
        self.vad_queue: list[np.ndarray] = []
        self.vad_wakeup = asyncio.Event()
        self.vad_task: asyncio.Task | None = None
        self.vad_failure: str | None = None  # the code of the VAD failure last reported (once, until it answers)
        # one ASR request at a time per session, turns in order: one append holding many turns (or a client
        # committing in a loop) must not take the shared ASR stage from every other client
        self.asr_slot = asyncio.Semaphore(1)
        self.speech_item_id: str | None = None  # the item a detected turn will become
        self.speech_start: int | None = None
        self.response: Response | None = None
        self.tasks: set[asyncio.Task] = set()
        self._send_lock = asyncio.Lock()
        self.closed = False

    # -- output ------------------------------------------------------------------------------------
    async def send(self, event: dict) -> None:
        if self.closed:
            return
        text = encode(event)
        async with self._send_lock:
            try:
                await self._send_text(text)
            except Exception:  # noqa: BLE001 - the client is gone; the receive loop ends the session
                self.closed = True

    async def error(self, error: ProtocolError) -> None:
        await self.send(error_event(error))

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.send({"type": "session.created", "session": self.session})
        self._configure_vad()

    async def run(self, receive) -> None:
        """Reads frames until the client disconnects. receive() -> ASGI websocket message."""
        while True:
            # receive() returns a frame already read without suspending: a client's burst of events (thousands
            # sent at once) kept the event loop, so every other request and session, until the last was handled
            await asyncio.sleep(0)
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("text")
            if data is None:
                await self.error(ProtocolError("binary frames are not supported; send JSON text events",
                                               code="invalid_json"))
                continue
            try:
                await self.handle(decode(data))
            except ProtocolError as exc:
                await self.error(exc)
            except Exception as exc:  # noqa: BLE001 - our bug: report it and keep the session
                log.exception("realtime session %s: event failed", self.request_id)
                await self.error(ProtocolError(f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                                               type="server_error"))

    async def close(self) -> None:
        self.closed = True
        await self._abandon_speculation()
        response = self.response
        tasks = [t for t in (response.task if response else None, self.vad_task, *self.tasks) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if response is not None:  # also when its task never ran
            response.release()
            if response.adopted is not None:
                await response.adopted.aclose()
        if self.vad is not None:
            await self.vad.close()
        # Let go of the audio and the items now: tasks that ended by an exception (cancelled ones too) keep their
        # frames, and so this session, in reference cycles that only the garbage collector's rare full passes free;
        # a closed session that had buffered minutes of audio held ~100-200 MB until then.
        self.buffer, self.vad_queue, self.conversation = [], [], Conversation()
        self.response = self.vad_task = self.speculation = None
        self.tasks.clear()

    def _spawn(self, work) -> asyncio.Task:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("realtime session %s: task failed", self.request_id, exc_info=task.exception())

    # -- client events -----------------------------------------------------------------------------
    async def handle(self, event: dict) -> None:
        kind, event_id = event["type"], event.get("event_id")
        if kind not in _KEEPS_SPECULATION:
            await self._abandon_speculation()
        try:
            handler = getattr(self, "_on_" + kind.replace(".", "_"))
            await handler(event)
        except ProtocolError as exc:
            exc.event_id = exc.event_id or event_id
            raise

    async def _on_session_update(self, event: dict) -> None:
        update = {k: v for k, v in event["session"].items() if k not in session_config.READ_ONLY}
        base = self.session
        if update.get("type") == "transcription" and base.get("type") != "transcription":
            base = {"type": "transcription", "object": "realtime.transcription_session", "id": base["id"],
                    "audio": {"input": base["audio"]["input"]}, "include": None}
        elif update.get("type") == "realtime" and base.get("type") != "realtime":
            default = session_config.default_session(self.model, base["id"])
            base = {**default, "audio": {**default["audio"], "input": base["audio"]["input"]}}
        merged = session_config.merge(base, update)
        if merged.get("type") == "realtime":
            merged["model"] = self.model  # the connection's pipeline; a session cannot switch models
        settings = session_config.validate(merged, event.get("event_id"), self.max_text_chars)
        session_config.check_length(update.get("instructions"), "session.instructions", self.max_text_chars)
        if settings.kind == "realtime" and settings.voice != self.settings.voice:
            await self._check_voice(settings.voice, "session.audio.output.voice")
        if settings.kind == "realtime" and (settings.instructions, settings.max_tokens) != (
                self.settings.instructions, self.settings.max_tokens):
            await self._check_prompt(settings.instructions, settings.max_tokens, "session")
        old = self.settings  # nothing of the session changes before every check has passed
        self.session, self.settings = merged, settings
        if (settings.input_format, settings.input_rate) != (old.input_format, old.input_rate):
            self.decoder = InputDecoder(settings.input_format, settings.input_rate)
        if settings.vad != old.vad:
            await self._stop_vad()
            self._configure_vad()
        await self.send({"type": "session.updated", "session": self.session})

    async def _on_input_audio_buffer_append(self, event: dict) -> None:
        data = b64decode(event["audio"], "audio")
        if len(data) > MAX_APPEND_BYTES:
            raise ProtocolError(f"audio chunk of {len(data)} bytes is over the limit of {MAX_APPEND_BYTES} bytes "
                                "per append event", code="audio_too_large", param="audio")
        seconds = self.decoder.seconds(data)   # bounds from the length, before decoding (G.711: 1 byte a sample)
        if seconds > MAX_APPEND_S:
            raise ProtocolError(f"audio chunk of {seconds:.1f} s is over the limit of {MAX_APPEND_S:.0f} s per append "
                                "event", code="audio_too_large", param="audio")
        if self.appended - self.buffer_start + round(seconds * STAGE_RATE) > MAX_BUFFER_S * STAGE_RATE:
            raise ProtocolError(f"the input audio buffer holds more than {MAX_BUFFER_S} s; commit or clear it",
                                code="input_audio_buffer_full", param="audio")
        pcm = await self._decode(data, seconds)
        self.buffer.append(pcm)
        self.appended += pcm.size
        if self.vad is not None:
            self.vad_queue.append(pcm)
            self.vad_wakeup.set()

    async def _on_input_audio_buffer_commit(self, event: dict) -> None:
        audio = self._take(self.appended)
        if audio.size * 1000 < MIN_COMMIT_MS * STAGE_RATE:
            raise ProtocolError(f"buffer too small: expected at least {MIN_COMMIT_MS} ms of audio, got "
                                f"{audio.size * 1000 / STAGE_RATE:.0f} ms", code="input_audio_buffer_commit_empty")
        await self._commit(audio, self.speech_item_id or new_id("item"))
        self.speech_item_id = self.speech_start = None

    async def _on_input_audio_buffer_clear(self, event: dict) -> None:
        """Drops the buffer and the turn under way in it (`handle` dropped its speculation): audio appended afterwards
        is no part of it (it was committed later as the cleared turn, a phantom user item answered unasked)."""
        self._take(self.appended)
        self.speech_item_id = self.speech_start = None
        await self.send({"type": "input_audio_buffer.cleared"})

    async def _on_output_audio_buffer_clear(self, event: dict) -> None:
        raise ProtocolError("output_audio_buffer.clear is only for WebRTC/SIP sessions; over WebSocket, stop playback "
                            "on the client and send conversation.item.truncate", code="unsupported_event")

    async def _decode(self, data: bytes, seconds: float, param: str = "audio") -> np.ndarray:
        """The payload as float32 16 kHz; one over INLINE_DECODE_S seconds is decoded on a worker thread (a 218 s
        G.711 append took ~0.5 s of the event loop). Events are handled one at a time, so the decoder is never
        shared."""
        if seconds <= INLINE_DECODE_S:
            return self.decoder.decode(data, param)
        return await asyncio.to_thread(self.decoder.decode, data, param)

    async def _on_conversation_item_create(self, event: dict) -> None:
        item, audio = item_from_client(event["item"])
        for index, part in enumerate(item.parts):   # as chat messages are bounded (a 5 MB item was kept whole)
            session_config.check_length(part.text, f"item.content[{index}].text", self.max_text_chars)
        if (chars := sum(len(part.text) for part in item.parts)) > self.max_text_chars:   # 120 parts were 15 M
            raise ProtocolError(f"item.content holds {chars} characters of text in all; the limit is "
                                f"{self.max_text_chars} (--max-text-chars)", param="item.content")
        payloads, held = [], 0.0   # every part bounded by the duration in all (from the lengths) before any decode
        for part, b64, param in audio:
            payloads.append((part, b64decode(b64, param), param))
            held += self.decoder.seconds(payloads[-1][1])
            if held > MAX_ITEM_AUDIO_S:
                raise ProtocolError(f"{param} brings the item's audio to {held:.1f} s; an item holds at most "
                                    f"{MAX_ITEM_AUDIO_S} s", code="audio_too_large", param=param)
        for part, data, param in payloads:
            part.audio = await self._decode(data, self.decoder.seconds(data), param)
        previous = self.conversation.add(item, event.get("previous_item_id"))
        await self._announce(item, previous)
        await self.trim_conversation(item)
        if not item.transcribed.is_set():
            self._spawn(self._transcribe(item))

    async def _on_conversation_item_retrieve(self, event: dict) -> None:
        item = self.conversation.get(event["item_id"])
        wire = item.wire()
        for part, content in zip(item.parts, wire["content"]):   # the user's audio, in the session's input format
            if (pcm := part.user_audio) is not None:
                audio = stage_audio_as(pcm, self.settings.input_format, self.settings.input_rate)
                content["audio"] = base64.b64encode(audio).decode()
        await self.send({"type": "conversation.item.retrieved", "item": wire})

    async def _on_conversation_item_delete(self, event: dict) -> None:
        self.conversation.delete(event["item_id"])
        await self.send({"type": "conversation.item.deleted", "item_id": event["item_id"]})

    async def _on_conversation_item_truncate(self, event: dict) -> None:
        item = self.conversation.get(event["item_id"])
        truncate(item, event["content_index"], event["audio_end_ms"])
        await self.send({"type": "conversation.item.truncated", "item_id": item.id,
                         "content_index": event["content_index"], "audio_end_ms": event["audio_end_ms"]})

    async def _on_response_create(self, event: dict) -> None:
        if self.settings.kind != "realtime":
            raise ProtocolError("transcription sessions do not create responses", code="invalid_session_type")
        if self.response is not None:
            raise ProtocolError(f"conversation already has an active response {self.response.id}",
                                code="conversation_already_has_active_response")
        spec = event.get("response") or {}
        settings = session_config.response_settings(spec, self.settings, self.max_text_chars)
        if settings.audio_out and settings.voice != self.settings.voice:
            await self._check_voice(settings.voice, "response.audio.output.voice")
        if (settings.instructions, settings.max_tokens) != (self.settings.instructions, self.settings.max_tokens):
            await self._check_prompt(settings.instructions, settings.max_tokens, "response")
        self._start_response(spec, settings, Response(spec, settings, event.get("event_id")))

    async def _on_response_cancel(self, event: dict) -> None:
        wanted = event.get("response_id")
        if self.response is None or (wanted and wanted != self.response.id):
            raise ProtocolError("there is no active response to cancel" if not wanted else
                                f"response {wanted!r} is not active", code="response_cancel_not_active",
                                param="response_id" if wanted else None)
        await self._cancel_response("client_cancelled")

    # -- turns -------------------------------------------------------------------------------------
    def _take(self, end: int, start: int | None = None, keep: bool = False) -> np.ndarray:
        """Remove the buffer's samples before absolute index `end` (`keep`: leave the buffer as it is);
        returns those from `start` on, as a new array. The buffer is sliced chunk by chunk, never joined whole: a
        turn holds only its own samples (a view of the joined buffer kept the whole of it alive for every turn,
        ~14 MB a turn for one 218 s append) and taking n turns from a long append is O(n), not O(n^2) copying."""
        cut = max(0, min(end - self.buffer_start, sum(chunk.size for chunk in self.buffer)))
        head, rest = _split(self.buffer, cut)
        taken = _split(head, 0 if start is None else max(0, min(start - self.buffer_start, cut)))[1]
        if not keep:
            self.buffer, self.buffer_start = rest, self.buffer_start + cut
        return np.concatenate(taken) if taken else np.zeros(0, np.float32)

    async def _commit(self, audio: np.ndarray, item_id: str) -> None:
        speculation, self.speculation = self.speculation, None
        if speculation is not None and (speculation[0].item_id != item_id or self.response is not None
                                        or not self.settings.create_response):
            await _drop(speculation)
            speculation = None
        previous = self.conversation.last_id
        item = Item(item_id, "user", [Part("input_audio", audio=audio)])
        self.conversation.add(item)
        await self.send({"type": "input_audio_buffer.committed", "item_id": item.id, "previous_item_id": previous})
        await self._announce(item, previous)
        await self.trim_conversation(item)
        if speculation is not None:  # its transcript and its held response become this turn's
            work, response = speculation
            self._spawn(self._transcribe(item, work.asr))
            self._start_response(response.spec, response.settings, response, work.adopt())
            return
        self._spawn(self._transcribe(item))
        if self.settings.create_response and self.response is None:
            self._start_response({}, session_config.response_settings({}, self.settings))

    async def _announce(self, item: Item, previous: str | None) -> None:
        await self.send({"type": "conversation.item.added", "item": item.wire(), "previous_item_id": previous})
        await self.send({"type": "conversation.item.done", "item": item.wire(), "previous_item_id": previous})

    async def trim_conversation(self, added: Item) -> None:
        """Keeps the conversation within its bounds after `added` came (`Conversation.trim`): the oldest items go,
        each with conversation.item.deleted."""
        for item_id in self.conversation.trim(added):
            await self.send({"type": "conversation.item.deleted", "item_id": item_id})

    async def _asr(self, audio: np.ndarray | Part) -> dict | None:
        """The ASR stage's RESULT for float32 16 kHz audio, after the session's earlier ASR calls (`asr_slot`). A Part's
        audio is read once the slot is taken (not held while queued): None if it has none by then (its item was
        deleted). Raises APIError (503 `pipeline_sleeping` while the pipeline sleeps)."""
        async with self.asr_slot:
            pcm = audio.audio if isinstance(audio, Part) else audio
            if pcm is None:
                return None
            self.control.check(self.pipeline)
            return await transcribe(self.triton, self.pipeline.asr, pcm, self.settings.transcription_language,
                                    self.settings.transcription_prompt)

    def _stage_error(self, exc: APIError) -> APIError:
        """What to report for a failed stage call: `exc`, or the pipeline's `pipeline_sleeping` error when it
        sleeps now (put to sleep during the call, its models were unloaded under it: the call fails as an
        unknown model)."""
        try:
            self.control.check(self.pipeline)
        except APIError as asleep:
            return asleep
        return exc

    async def _transcribe(self, item: Item, first: asyncio.Task | None = None) -> None:
        """Transcribe the item's audio parts (the ASR stage) and report them; the item is then usable.
        `first`: the ASR result of the first audio part, already underway (a speculation's)."""
        try:
            for index, part in enumerate(item.parts):
                if part.kind != "input_audio":
                    continue
                if part.text:   # the client's own transcript: its audio is kept as a transcribed part's
                    self.conversation.keep_audio(part)
                    continue
                try:
                    result = await (first if first is not None else self._asr(part))
                    first = None
                except APIError as exc:
                    exc = self._stage_error(exc)
                    if self.settings.transcribe:
                        await self.send({"type": "conversation.item.input_audio_transcription.failed",
                                         "item_id": item.id, "content_index": index,
                                         "error": {"type": "transcription_error", "code": exc.code,
                                                   "message": exc.message, "param": None}})
                    self.conversation.keep_audio(part)
                    continue
                if result is None or part.audio is None:   # the item was deleted (by the client or `trim`)
                    continue
                part.text, seconds = result["text"], part.audio.size / STAGE_RATE
                self.conversation.keep_audio(part)   # the transcript is what later turns use
                if self.settings.transcribe:
                    # the segments' (stripped) texts joined as the transcript joins them: the deltas add up to it
                    texts = [t for t in (segment["text"] for segment in result.get("segments") or []) if t]
                    for n, text in enumerate(texts):
                        await self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item.id,
                                         "content_index": index, "delta": text if n == 0 else f" {text}"})
                    await self.send({"type": "conversation.item.input_audio_transcription.completed",
                                     "item_id": item.id, "content_index": index, "transcript": part.text,
                                     "usage": {"type": "duration", "seconds": round(seconds, 3)}})
        finally:
            item.transcribed.set()

    # -- VAD ---------------------------------------------------------------------------------------
    def _configure_vad(self) -> None:
        if self.settings.vad is None or self.pipeline.vad is None:
            return
        options = dict(self.settings.vad)
        if self.speculation_ms is not None and self.settings.kind == "realtime":
            options["pause_duration_ms"] = self.speculation_ms  # speech_paused / speech_resumed events
        self.vad = VADSequence(self.triton, self.pipeline.vad, options)
        self.vad_origin = self.appended
        self.vad_queue, self.speech_start, self.speech_item_id = [], None, None
        self.vad_task = asyncio.create_task(self._feed_vad(self.vad))

    async def _stop_vad(self) -> None:
        await self._abandon_speculation()
        if self.vad_task is not None:
            self.vad_task.cancel()
            await asyncio.gather(self.vad_task, return_exceptions=True)
        if self.vad is not None:
            await self.vad.close()
        self.vad = self.vad_task = None

    async def _feed_vad(self, vad: VADSequence) -> None:
        """Sends queued audio to the VAD model (everything queued since the last call in one request)."""
        scored = 0
        while True:
            await self.vad_wakeup.wait()
            self.vad_wakeup.clear()
            if not self.vad_queue:
                continue
            head, self.vad_queue = _split(self.vad_queue, VAD_MAX_S * STAGE_RATE)
            chunk = np.concatenate(head) if head else np.zeros(0, np.float32)   # (appends of no samples)
            if self.vad_queue:
                self.vad_wakeup.set()
            try:
                self.control.check(self.pipeline)  # asleep, its VAD model is unloaded: the audio is not scored
                found = await vad.feed(chunk)
            except APIError as exc:
                exc = self._stage_error(exc)
                if exc.code != self.vad_failure:   # each kind of failure once, not once per append
                    self.vad_failure = exc.code
                    await self.error(self._vad_error(exc))
                # start a new sequence with the next chunk (the model may have dropped this one, refused its START,
                # or been reloaded); END this one first so that it frees its slot now, not after the idle timeout
                await self._abandon_speculation()
                self.vad_origin, scored = self.vad_origin + scored + chunk.size, 0
                await vad.close()
                vad.restart()
                continue
            self.vad_failure = None
            scored += chunk.size
            for turn in found:
                await self._on_turn(turn)
            if self.speech_start is None:  # nobody speaks: keep only what a prefix padding may need
                keep = self.vad_origin + scored - vad.options["prefix_padding_ms"] * STAGE_RATE // 1000 - STAGE_RATE
                if keep > self.buffer_start:
                    self._take(keep)

    @staticmethod
    def _vad_error(exc: APIError) -> ProtocolError:
        """The `error` event for a failed VAD call: sleeping and too many sessions keep their code; anything
        else is a `vad_error`."""
        if exc.code == "pipeline_sleeping":
            return ProtocolError(f"turn detection paused: {exc.message}", code=exc.code, type=exc.type)
        if exc.code == "too_many_sequences":
            return ProtocolError(f"turn detection refused: {exc.message}", code=exc.code, type=exc.type)
        return ProtocolError(f"voice activity detection failed: {exc.message}", code="vad_error", type="server_error")

    async def _on_turn(self, turn: dict) -> None:
        ms = lambda sample: int((self.vad_origin + sample) * 1000 // STAGE_RATE)  # noqa: E731
        if turn["type"] == "speech_started":
            self.speech_start = self.vad_origin + turn["audio_start"]
            self.speech_item_id = new_id("item")
            await self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": ms(turn["audio_start"]),
                             "item_id": self.speech_item_id})
            if self.response is not None and self.settings.interrupt_response:
                await self._cancel_response("turn_detected")
        elif turn["type"] == "speech_paused" and self.speech_item_id is not None:
            await self._speculate(self.vad_origin + turn["sample"])
        elif turn["type"] == "speech_resumed":
            await self._abandon_speculation()
        elif turn["type"] == "speech_stopped" and self.speech_item_id is not None:
            item_id, start = self.speech_item_id, self.speech_start
            self.speech_item_id = self.speech_start = None
            # OpenAI's audio_end_ms "includes the min_silence_duration_ms": the end of the audio the item holds
            await self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": ms(turn["sample"]),
                             "item_id": item_id})
            audio = self._take(self.vad_origin + turn["sample"], start)
            if audio.size * 1000 >= MIN_COMMIT_MS * STAGE_RATE:
                await self._commit(audio, item_id)
            else:
                await self._abandon_speculation()

    # -- speculation (preemptive responses) ---------------------------------------------------------
    async def _speculate(self, end: int) -> None:
        """At a pause: start answering the turn's audio so far (see speculation.py), held until adopted."""
        await self._abandon_speculation()
        if (self.response is not None or not self.settings.create_response or self.closed
                or self.pipeline.name in self.control.sleeping):
            return
        audio = self._take(end, self.speech_start, keep=True)
        if audio.size * 1000 < MIN_COMMIT_MS * STAGE_RATE:
            return
        ticket = self.gate.try_enter()  # optional work: only on a slot free now, never queued
        if ticket is None:
            return
        response = Response({}, session_config.response_settings({}, self.settings))
        response.ticket = ticket
        work = Speculation(self.speech_item_id, self.speech_start, end, audio, self._asr, self._pipeline_events,
                           self._pipeline_body(response), f"{self.request_id}-{response.id}", self.conversation,
                           response.instructions, self.outcomes)
        self.speculation = (work, response)

    async def _abandon_speculation(self) -> None:
        speculation, self.speculation = self.speculation, None
        if speculation is not None:
            await _drop(speculation)

    # -- responses ---------------------------------------------------------------------------------
    async def _check_voice(self, voice: str, param: str) -> None:
        """Ask the pipeline whether it speaks `voice` (its own check of a request's voice), so that an
        unknown voice is refused by the event that sets it, not when a response runs. Raises ProtocolError
        naming `param` (the field of the client event)."""
        await self._ask(lambda: pipeline_stream.voices(self.triton, self.pipeline.entry, self.request_id, voice),
                        "voice", lambda _: param)

    async def _check_prompt(self, instructions: str, max_tokens: int | None, where: str) -> None:
        """Ask the pipeline whether the smallest prompt a response can send with these `instructions` (the system
        message of an empty conversation: truncation leaves out every item but the newest) plus `max_tokens`
        (max_output_tokens; None: "inf") fits its LLM's context, so that instructions that never can are refused by
        the event that sets them (`where`: "session" or "response"), not at every response. Raises ProtocolError
        (`context_length_exceeded`) naming `{where}.instructions`, or `{where}.max_output_tokens` when only the
        output budget does not fit. A pipeline that cannot answer (5xx: unreachable, failing) does not stop the
        event: the length is then judged when a response runs, as before this check."""
        messages = self.conversation.messages(instructions, [])
        tokens = session_config.effective_max_tokens(max_tokens)
        await self._ask(lambda: pipeline_stream.prompt_tokens(self.triton, self.pipeline.entry, self.request_id,
                                                              messages, tokens),
                        "instructions' length",
                        lambda param: f"{where}.max_output_tokens" if param == "max_tokens" else f"{where}.instructions",
                        required=False)

    async def _ask(self, call, what: str, param_of, required: bool = True) -> None:
        """Awaits `call()`, a control request to the pipeline, unless it sleeps. Raises ProtocolError: for the
        pipeline's refusal (4xx) its message and code, with param `param_of(the pipeline's param)`; for its failure
        (5xx) "could not check the `what`", unless not `required` (then the check is left to the response)."""
        try:
            self.control.check(self.pipeline)
            await call()
        except APIError as exc:
            if exc.status >= 500 and not required:
                log.warning("realtime session %s: could not check the %s: %s", self.request_id, what, exc.message)
                return
            if exc.status >= 500:
                raise ProtocolError(f"could not check the {what}: {exc.message}", code=exc.code or "pipeline_error",
                                    type=exc.type) from None
            raise ProtocolError(exc.message, code=exc.code or "invalid_value", param=param_of(exc.param)) from None

    def _start_response(self, spec: dict, settings: session_config.ResponseSettings, response: Response | None = None,
                        events: Speculation | None = None) -> None:
        """Runs a new response (or `response`, a speculation's, streaming `events`: the adopted speculation)."""
        response = response or Response(spec, settings)
        response.adopted = events
        self.response = response
        response.task = asyncio.create_task(self._respond(response))

    def _pipeline_body(self, response: Response) -> dict:
        """The chat pipeline's REQUEST for `response`, without its messages (spoken: a first chunk of at most
        FIRST_CHUNK_WORDS words)."""
        body = {"modalities": ["audio" if response.audio_out else "text"], "voice": response.voice,
                "max_tokens": session_config.effective_max_tokens(response.max_tokens)}
        return {**body, "first_chunk_words": FIRST_CHUNK_WORDS} if response.audio_out else body

    def _pipeline_events(self, body: dict, request_id: str):
        return pipeline_stream.events(self.triton, self.pipeline.entry, body, request_id)

    async def _cancel_response(self, reason: str) -> None:
        """Cancels the running response (`reason`: its status_details.reason) and returns once it has ended; one
        that is already closing (`Response.ending`) ends as it was going to."""
        response = self.response
        if response is None or response.task is None or response.ending:
            return
        response.reason = reason
        response.task.cancel()
        await asyncio.gather(response.task, return_exceptions=True)
        if self.response is response:  # cancelled before its first step: _respond never ran, so end it here
            self.response = None
            response.release()
            if response.adopted is not None:
                await response.adopted.aclose()
            await self.send({"type": "response.created", "response": response.wire("in_progress")})
            await self.send({"type": "response.done", "response": response.wire(
                "cancelled", {"type": "cancelled", "reason": reason})})

    async def _fitted_events(self, response: Response, items: list[Item], events: Speculation | None):
        """The response's pipeline events (`events`: an adopted speculation's, else a new request), with truncation
        "auto" as OpenAI defines it: the history is kept within HISTORY_CHARS characters, and while the pipeline
        refuses the prompt plus max_tokens as past its context (`context_length_exceeded`, its first event: no
        output yet) the oldest items are left out, half the characters at a time, until fewer are sent; once only
        the newest is left the refusal stands (a session of token-dense items, digits or code, got every response
        refused for good). Raises APIError as the pipeline does."""
        budget = HISTORY_CHARS
        sent = None if events is not None else self.conversation.messages(response.instructions, items, budget)
        while True:
            try:
                if events is None:
                    retry = "" if budget == HISTORY_CHARS else f"-fit{budget}"   # a retry's own request id
                    events = self._pipeline_events({"messages": sent, **self._pipeline_body(response)},
                                                   f"{self.request_id}-{response.id}{retry}")
                return pipeline_stream.prepend(await anext(events, None), events)
            except APIError as exc:
                if exc.code != "context_length_exceeded":
                    raise
                fewer = sent   # None: the speculation's messages, built within HISTORY_CHARS
                while fewer == sent and budget > 1:
                    budget //= 2
                    fewer = self.conversation.messages(response.instructions, items, budget)
                if fewer == sent:
                    raise
                sent, events = fewer, None

    async def _respond(self, response: Response) -> None:
        """Runs one response and always ends it with response.done (completed, incomplete, cancelled or failed),
        after closing what it opened (`_Output.finish`). Refused as HTTP requests are (an `error` event, then
        status failed): 503 `pipeline_sleeping` at once, 429 `pipeline_overloaded` / `queue_timeout` from the
        admission gate (a response queued for a slot is `in_progress` meanwhile)."""
        status, details = "completed", None
        events = response.adopted
        output = _Output(self, response)
        try:
            await self.send({"type": "response.created", "response": response.wire("in_progress")})
            self.control.check(self.pipeline)
            items = list(self.conversation.items)
            await asyncio.gather(*(item.transcribed.wait() for item in items))
            if response.ticket is None:  # an adopted speculation's response holds its slot already
                response.ticket = self.gate.enter()
                await response.ticket.wait()
            events = await self._fitted_events(response, items, events)
            async for event, audio in events:
                await output.event(event, audio)
            if output.finish_reason == "length":
                status, details = "incomplete", {"type": "incomplete", "reason": "max_output_tokens"}
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": response.reason}
        except APIError as exc:
            exc = self._stage_error(exc)
            status = "failed"
            details = {"type": "failed", "error": {"type": exc.type, "code": exc.code or "pipeline_error"}}
            # the pipeline's param names a field of its own request, not of a client event: none to point at
            await self.error(ProtocolError(exc.message, code=exc.code or "pipeline_error", type=exc.type,
                                           event_id=response.event_id))
        except Exception as exc:  # noqa: BLE001 - the session survives our own bugs too; the client is told
            log.exception("realtime response %s failed", response.id)
            status, details = "failed", {"type": "failed", "error": {"type": "server_error", "code": "internal_error"}}
            await self.error(ProtocolError(f"internal error: {type(exc).__name__}: {exc}", code="internal_error",
                                           type="server_error", event_id=response.event_id))
        finally:
            response.ending = True
            if response.adopted is not None:
                await response.adopted.aclose()
            response.release()
            if status in ("completed", "incomplete") or response.item is not None:  # an answer has its item
                await output.finish("completed" if status == "completed" else "incomplete")
            self.response = None
            await self.send({"type": "response.done", "response": response.wire(status, details)})


class _Output:
    """Maps one response's pipeline events onto the output item, its content part and the delta events."""

    def __init__(self, session: RealtimeSession, response: Response):
        self.session, self.response = session, response
        settings = response.settings
        self.encoder = OutputEncoder(settings.output_format, settings.output_rate)
        self.part = Part("output_audio" if response.audio_out else "output_text")
        self.finish_reason = None
        self.part_open = False  # response.content_part.added was sent
        self.ids = {"response_id": response.id, "output_index": 0}

    async def _open(self) -> None:
        if self.response.item is not None:
            return
        item = Item(new_id("item"), "assistant", [self.part], status="in_progress")
        self.response.item = item
        self.ids["item_id"] = item.id
        previous = None
        if self.response.in_conversation:
            previous = self.session.conversation.add(item)
        send = self.session.send
        await send({"type": "response.output_item.added", "response_id": self.response.id, "output_index": 0,
                    "item": item.wire()})
        if self.response.in_conversation:
            await send({"type": "conversation.item.added", "item": item.wire(), "previous_item_id": previous})
            await self.session.trim_conversation(item)
        await send({"type": "response.content_part.added", **self.ids, "content_index": 0, "part": self._part_wire()})
        self.part_open = True

    def _part_wire(self) -> dict:
        if self.part.kind == "output_audio":
            return {"type": "audio", "transcript": self.part.text}
        return {"type": "text", "text": self.part.text}

    async def event(self, event: dict, audio: np.ndarray | None) -> None:
        kind, send = event.get("type"), self.session.send
        if event.get("usage") is not None:  # the counts so far (deltas) or in all (done)
            self.response.usage = usage_wire(event["usage"])
        if kind == "done":
            self.finish_reason = event.get("finish_reason")
        elif kind == "text.delta" and event.get("text") and not self.response.audio_out:
            await self._open()
            self.part.text += event["text"]
            await send({"type": "response.output_text.delta", **self.ids, "content_index": 0, "delta": event["text"]})
        elif kind == "audio.delta" and self.response.audio_out and (audio is not None or event.get("transcript")):
            # a transcript without samples (a pipeline's text written after its last audio) is transcript only, as
            # chat's delta.audio; text the voice cannot say ("👍") comes as 10 ms of silence with its transcript
            await self._open()
            data = b"" if audio is None else self.encoder.encode(audio, int(event.get("sample_rate", 24000)))
            words = (event.get("transcript") or "").strip()
            delta = (" " if self.part.text and words else "") + words
            self.part.text += delta
            self.part.spoken.append((words, self.encoder.duration_ms(data)))
            if delta:
                await send({"type": "response.output_audio_transcript.delta", **self.ids, "content_index": 0,
                            "delta": delta})
            if audio is not None:
                await send({"type": "response.output_audio.delta", **self.ids, "content_index": 0,
                            "delta": base64.b64encode(data).decode()})

    async def finish(self, status: str) -> None:
        """Closes the output in order: the part's `response.output_audio.done` + `.output_audio_transcript.done`
        (or `.output_text.done`), `response.content_part.done`, `response.output_item.done`, then
        `conversation.item.done` (an item in the conversation); each only for what was opened, after opening the
        item when nothing was (an answer with no output). status: the item's, "completed" | "incomplete"."""
        await self._open()
        item, send = self.response.item, self.session.send
        item.status = status
        if self.part_open:
            if self.part.kind == "output_audio":
                await send({"type": "response.output_audio.done", **self.ids, "content_index": 0})
                await send({"type": "response.output_audio_transcript.done", **self.ids, "content_index": 0,
                            "transcript": self.part.text})
            else:
                await send({"type": "response.output_text.done", **self.ids, "content_index": 0, "text": self.part.text})
            await send({"type": "response.content_part.done", **self.ids, "content_index": 0,
                        "part": self._part_wire()})
        await send({"type": "response.output_item.done", "response_id": self.response.id, "output_index": 0,
                    "item": item.wire()})
        if self.response.in_conversation:
            with contextlib.suppress(ProtocolError):
                index = self.session.conversation.index(item.id)
                previous = self.session.conversation.items[index - 1].id if index else None
                await send({"type": "conversation.item.done", "item": item.wire(), "previous_item_id": previous})


def _split(chunks: list[np.ndarray], at: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The samples of `chunks` (in order) before sample `at` and from it on, as two lists of views of the chunks (none
    joined: splitting a long append again and again copies nothing); empty pieces are left out."""
    before, after, offset = [], [], 0
    for chunk in chunks:
        cut = min(max(at - offset, 0), chunk.size)
        if cut:
            before.append(chunk[:cut])
        if cut < chunk.size:
            after.append(chunk[cut:])
        offset += chunk.size
    return before, after


async def _drop(speculation: tuple[Speculation, Response]) -> None:
    """Abandons a speculation (its Triton requests cancelled) and frees the admission slot its response held."""
    work, response = speculation
    await work.abandon()
    response.release()
