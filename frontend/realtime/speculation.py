"""Preemptive responses: a turn's work started at a pause in the user's speech, before the turn ends.

With server VAD a turn ends after `silence_duration_ms` (500 ms) of silence, and only then is it committed,
transcribed and answered. The VAD stage also reports `speech_paused` after a shorter silence
(`pause_duration_ms`, the frontend's `--realtime-speculation-ms`). At that pause the session starts a
`Speculation`: the ASR stage transcribes the audio buffered so far, then the chat pipeline (LLM -> TTS)
answers the conversation plus that transcript, and its events are held in a queue; nothing reaches the
client. If the turn then stops with no more speech (`speech_stopped` of the same item, nothing else
changed), the session adopts it: the turn is committed as usual, its transcript is the speculation's and
its response streams the held events, then the live ones, so the client sees the very events it would
have seen, only sooner. Anything else (`speech_resumed`, a client event that changes the buffer, the
conversation or the session, a response started meanwhile, the session closing) abandons it: its Triton
requests are cancelled (so every stage's in-flight count returns to 0) and the turn runs as before.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
from prometheus_client import Counter

from omni_frontend.errors import APIError
from omni_frontend.realtime.conversation import Conversation, Item, Part

# the pipeline's (event, payload) pairs, as omni_frontend.pipeline_stream.events yields them
PipelineEvents = Callable[[dict, str], AsyncIterator[tuple[dict, np.ndarray | None]]]
_END = object()
log = logging.getLogger("omni_frontend.realtime")


class Speculation:
    """One turn's preemptive response, running from a pause until it is adopted or abandoned.

    item_id: the id the turn's item will get; start / end: absolute 16 kHz sample indexes of the audio it
    answers (`audio`, float32 16 kHz); transcribe(pcm) -> the ASR stage's RESULT dict (raises APIError);
    events(body, request_id): the chat pipeline's events for a pipeline request body; body: that body
    without `messages` (modalities, voice, max_tokens); conversation / instructions: what the messages are
    built from (the items present now plus the transcript); outcomes: the
    `omni_frontend_realtime_speculations_total` counter (labels outcome=adopted|abandoned) or None.
    """

    def __init__(self, item_id: str, start: int, end: int, audio: np.ndarray,
                 transcribe: Callable[[np.ndarray], Awaitable[dict]], events: PipelineEvents, body: dict,
                 request_id: str, conversation: Conversation, instructions: str, outcomes: Counter | None = None):
        self.item_id, self.start, self.end = item_id, start, end
        self.outcomes = outcomes
        self.items = list(conversation.items)
        self._conversation = conversation
        self._instructions, self._body, self._events, self._request_id = instructions, body, events, request_id
        self._queue: asyncio.Queue = asyncio.Queue()
        self._started = time.perf_counter()
        self.asr = asyncio.create_task(transcribe(audio))
        self._pipeline = asyncio.create_task(self._run())
        self.settled = False

    async def _run(self) -> None:
        """Transcript first, then the pipeline; every event (then _END, or the error) goes to the queue."""
        try:
            await asyncio.gather(*(item.transcribed.wait() for item in self.items))
            try:
                text = (await asyncio.shield(self.asr))["text"]   # cancelling the response leaves the ASR be
            except APIError:
                text = ""  # the turn then counts with no text, as a failed transcription does without speculation
            turn = Item(self.item_id, "user", [Part("input_text", text=text)])
            messages = self._conversation.messages(self._instructions, self.items + [turn])
            async for pair in self._events({**self._body, "messages": messages}, self._request_id):
                self._queue.put_nowait(pair)
            self._queue.put_nowait(_END)
        except Exception as exc:  # noqa: BLE001 - raised again to the response that adopts it
            self._queue.put_nowait(exc)

    def adopt(self) -> "Speculation":
        """Takes it over: returns itself as the async iterator of the pipeline's (event, payload) pairs, held
        ones first (raises what the pipeline raised). `aclose()` cancels the pipeline request; `asr` now
        belongs to the caller."""
        self.settled = True
        if self.outcomes is not None:
            self.outcomes.labels("adopted").inc()
        log.info("speculation for %s adopted %.0f ms after the pause (transcript %s, %d pipeline events held)",
                 self.item_id, (time.perf_counter() - self._started) * 1000, "ready" if self.asr.done() else "pending",
                 self._queue.qsize())
        return self

    def __aiter__(self) -> "Speculation":
        return self

    async def __anext__(self) -> tuple[dict, np.ndarray | None]:
        pair = await self._queue.get()
        if pair is _END:
            raise StopAsyncIteration
        if isinstance(pair, BaseException):
            raise pair
        return pair

    async def aclose(self) -> None:
        """Cancels the pipeline request (end to end) if it still runs; returns once it is gone."""
        await _cancel(self._pipeline)

    async def abandon(self) -> None:
        """Cancels its ASR and pipeline requests (end to end) and waits until they are gone."""
        if self.settled:
            return
        self.settled = True
        if self.outcomes is not None:
            self.outcomes.labels("abandoned").inc()
        await _cancel(self._pipeline)
        await _cancel(self.asr)


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
