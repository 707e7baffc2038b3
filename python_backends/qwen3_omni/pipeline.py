"""In-process Qwen3-Omni pipeline: thinker -> talker -> code2wav, streamed, for many requests at once, each
engine on its own thread (and, on CUDA, its own stream, so the engines' kernels run concurrently).

The stage wiring the Triton orchestrator reproduces across models, the engine of the co-located Triton
stage (`serving/colocated_model.py`: one process on one GPU, no time slicing between stage processes),
and the reference the tests compare with `Qwen3OmniMoeForConditionalGeneration.generate`.

Threads and what crosses them (`LocalOmniPipeline`):
  thinker   its `EngineLoop` thread: continuous batching; each token goes to the request's `on_event`.
  consumer  whoever submitted the request reads its events and hands the tokens it accepts (after stop
            strings, say) to the talker with `speak` — so the talker speaks exactly the text the client got.
  talker    a `StageThread`: applies `talk` / `speak` / `abort` messages, then steps all requests that have
            text (`Talker.step`); the thinker's layer-0 embeddings of spoken ids are looked up here, from the
            thinker's own embedding table (shared weights, no copy between stages).
  code2wav  a `StageThread`: decodes the talker's frames into PCM chunks (`Code2WavStreamer.step`) and
            reports them as `SpeechChunk`s to `on_event`.
First audio: a request submitted with a `FirstAudioTimeline` gets its milestones marked on every thread on the way
to its first audio chunk (`first_audio`; the engine threads only look up requests still waiting for it).
Steady state: with a `StepProfile` every iteration of the three engine threads is recorded (`step_profile`).
Tensors between CUDA streams: the talker prompt (thinker hidden states) is complete before it is handed
over (the thinker thread synchronises its stream for a request's first token) and is marked as used by the
talker's stream (`record_stream`) so the allocator cannot reuse it early; every other crossing is host data.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from omni_backends.engine import SamplingParams, sm_split
from omni_backends.engine.options import EngineOptions
from omni_backends.engine.transfer import to_device
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.code2wav import Code2WavStreamer
from omni_backends.qwen3_omni.first_audio import FirstAudioTimeline
from omni_backends.qwen3_omni.loading import Qwen3OmniStages
from omni_backends.qwen3_omni.prompt import ThinkerInputs
from omni_backends.qwen3_omni.step_profile import StepProfile
from omni_backends.qwen3_omni.talker import Talker
from omni_backends.qwen3_omni.thinker import Thinker, ThinkerToken

log = logging.getLogger(__name__)
_STOP = object()
# Stream priorities on CUDA (lower = higher): the talker paces the audio (its frame takes longer than a
# thinker step), so its kernels go first when both engines have work queued.
TALKER_PRIORITY, OTHER_PRIORITY = -1, 0
# Python's GIL switch interval for a process running the engines' threads (`sys.setswitchinterval`, default 5 ms):
# a thread that wants the GIL back after a CUDA call waits up to this long for one busy in Python, so with three
# engine threads and the request coroutines each per-frame hand-off could cost milliseconds. Measured on the
# H200 (run 5, 16 streams in-process): 2.74 s -> 1.66 s per request at 0.5 ms (docs/gpu.md).
ENGINE_SWITCH_INTERVAL_S = 0.0005


@dataclass
class SpeechChunk:
    """Audio progress of one request, from the code2wav thread.

    Fields:
        codes: int64 [16, n] codec frames (12.5 Hz) made since the previous chunk (n may be 0).
        pcm: float32 [samples] at 24 kHz that became final (may be empty).
        finished: the request's last chunk; finish_reason: the talker's ("stop" | "length").
        error: set (with finished) when the talker or code2wav failed for this request: its text, or the talker's
            RequestError when it refused the request (the client's fault, e.g. a prompt past the talker's max_len).
    """

    codes: torch.Tensor
    pcm: np.ndarray
    finished: bool = False
    finish_reason: str | None = None
    error: str | RequestError | None = None


OnEvent = Callable[[ThinkerToken | SpeechChunk], None]


class StageThread:
    """A daemon thread that owns one engine: `post(message)` from any thread; the thread applies every
    message posted so far at once (`apply(messages)`, in order: so work of many messages can be batched), then
    runs one unit of work (`work()`) while `busy()` says there is some, and sleeps on its inbox otherwise. On
    CUDA its work runs on its own stream (of `partition`, its SM partition, when given: `sm_split`).

    An exception from `apply` or `work` goes to `failed(exc)` (on the thread); the thread keeps serving.
    `work()` returns the rows (frames, chunks) it made; `profile(wait, apply, work, rows)`, when given, gets the
    seconds of each iteration blocked on the inbox, applying and working, and those rows (`step_profile`).
    """

    def __init__(self, name: str, device: torch.device, apply: Callable[[list], None], work: Callable[[], int],
                 busy: Callable[[], bool], failed: Callable[[Exception], None], priority: int = OTHER_PRIORITY,
                 profile: Callable[[float, float, float, int], None] | None = None,
                 partition: sm_split.Partition | None = None):
        self.partition = partition
        self.stream = None
        if device.type == "cuda":
            self.stream = partition.stream(priority) if partition else torch.cuda.Stream(device, priority=priority)
        self._apply, self._work, self._busy, self._failed = apply, work, busy, failed
        self._profile = profile
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, message) -> None:
        self._inbox.put(message)

    def close(self, timeout: float | None = 10) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext(), \
                torch.inference_mode(), sm_split.within(self.partition):
            while True:
                started = time.monotonic()
                try:
                    messages = [self._inbox.get(block=not self._busy())]
                except queue.Empty:
                    messages = []
                while not self._inbox.empty():
                    messages.append(self._inbox.get_nowait())
                stop = _STOP in messages
                if stop:
                    messages = messages[:messages.index(_STOP)]
                woken = applied = time.monotonic()
                rows = 0
                try:
                    if messages:
                        self._apply(messages)
                    if stop:
                        return
                    applied = time.monotonic()
                    if self._busy():
                        rows = self._work()
                except Exception as exc:  # noqa: BLE001 - the owner fails the affected requests
                    self._failed(exc)
                if self._profile is not None:
                    done = time.monotonic()
                    try:
                        self._profile(woken - started, applied - woken, done - applied, rows)
                    except Exception:  # noqa: BLE001 - a profile never fails the engine
                        log.exception("step profile failed")


@dataclass
class _Speech:
    """A request's speech state across the talker and code2wav threads."""

    voice: str
    params: SamplingParams
    on_event: OnEvent
    started: bool = False                                            # talker thread: talker request exists
    codes: list[torch.Tensor] = field(default_factory=list)          # code2wav thread: frames not reported
    pending: list[torch.Tensor] = field(default_factory=list)        # code2wav thread: frames not decoded
    ending: tuple[str, str | RequestError | None] | None = None      # code2wav thread: (reason, error) to end with
    frames: int = 0                                                  # talker thread: frames made so far


class LocalOmniPipeline:
    """Thinker, talker and code2wav of one Qwen3-Omni checkpoint in this process (see the module doc).

    Args:
        thinker: a `Thinker` (its engine thread should run on its own stream on CUDA: `Thinker(stream=...)`).
        talker: a `Talker`; code2wav: a `Code2WavStreamer`; both are driven from their own threads here.
        profile: a `StepProfile` that gets every iteration of the three engine threads (None: not profiled).
        partitions: SM partitions of the talker and code2wav threads (`sm_split.partition`; the thinker's is given
            to `Thinker`); a stage not in it uses the whole device. Their graphs should be captured within them
            (`sm_split.within` around `warmup`).

    Thread-safe: `submit`, `speak`, `stop`, `abort` may be called from any thread. Every request gets its
    `on_event` calls from the engine threads: `ThinkerToken`s in order (exactly one finished), and, with a
    voice, `SpeechChunk`s in order (exactly one finished) once the consumer spoke its first token.
    """

    def __init__(self, thinker: Thinker, talker: Talker, code2wav: Code2WavStreamer,
                 profile: StepProfile | None = None, partitions: dict[str, sm_split.Partition] | None = None):
        self.thinker, self.talker, self.code2wav = thinker, talker, code2wav
        partitions = partitions or {}
        self.device = talker.device
        self._speech: dict[str, _Speech] = {}
        self._lock = threading.Lock()
        # requests before their first audio chunk whose submitter asked for a timeline (engine threads read it
        # without the lock: single dict operations are atomic)
        self._timelines: dict[str, FirstAudioTimeline] = {}
        self.profile = profile
        if profile is not None:
            profile.live = lambda: len(self._speech)
            thinker.loop.observe = self._thinker_observed
        self._talker = StageThread("qwen3-omni-talker", self.device, self._talker_apply, self._talker_work,
                                   talker.has_ready, self._talker_failed, priority=TALKER_PRIORITY,
                                   profile=None if profile is None else
                                   lambda *times: profile.stage("talker", *times), partition=partitions.get("talker"))
        self._code2wav = StageThread("qwen3-omni-code2wav", self.device, self._code2wav_apply, self._code2wav_work,
                                     self._code2wav_busy, self._code2wav_failed,
                                     profile=None if profile is None else
                                     lambda *times: profile.stage("code2wav", *times),
                                     partition=partitions.get("code2wav"))

    @classmethod
    def from_stages(cls, stages: Qwen3OmniStages, tts_embeds: torch.Tensor, chunk_frames: int = 25,
                    first_chunk_frames: int = 5, left_context_frames: int = 25, options: EngineOptions | None = None,
                    max_running: int = 32, profile: StepProfile | None = None) -> "LocalOmniPipeline":
        """All three engines of `loading.load_stages(dir)` (tts_embeds: `loading.load_tts_embeds`); the
        code2wav streamer settings and the thinker's / talker's `EngineOptions` (default "dynamic"; the static
        engine with graphs also replays code2wav's chunks from CUDA graphs); profile: as the constructor's."""
        device = next(stages.thinker.parameters()).device
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        thinker = Thinker(stages.thinker, stages.config, stages.tokenizer, stages.feature_extractor,
                          max_running=max_running, options=options, stream=stream,
                          image_processor=stages.image_processor)
        talker = Talker(stages.talker, stages.config, tts_embeds, options=options, max_running=max_running)
        graphs = options is not None and options.engine == "static" and options.cuda_graphs
        return cls(thinker, talker, Code2WavStreamer(stages.code2wav, chunk_frames, first_chunk_frames,
                                                     left_context_frames, graphs=graphs, max_batch=max_running),
                   profile)

    def close(self) -> None:
        """Stop the engine threads (requests in flight are aborted) and the profile."""
        self.thinker.shutdown()
        self._talker.close()
        self._code2wav.close()
        if self.profile is not None:
            self.profile.close()

    def _thinker_observed(self, kind: str, seconds: float) -> None:
        """The thinker engine loop's timing callback: its forwards go to the profile (not its queue times)."""
        if kind != "queue":
            self.profile.thinker(kind, seconds, self.thinker.loop.stats().running)

    # ---- consumer side (any thread) ----------------------------------------------------------------
    def submit(self, request_id: str, inputs: ThinkerInputs, params: SamplingParams, on_event: OnEvent,
               voice: str | None = None, talker_params: SamplingParams | None = None,
               timeline: FirstAudioTimeline | None = None) -> None:
        """Start a request: the thinker gets `inputs` now; with a `voice` (and `talker_params`,
        `Talker.sampling_params`) the talker starts when the consumer speaks the first token.
        timeline: with a voice, the engines mark the request's way to its first audio in it (from "submitted"
        to "code2wav_end"; the consumer marks "token_read", "audio_read" and "audio_sent").
        Raises RequestError for an unknown voice, ValueError for a request id in flight."""
        if voice is not None:
            self.talker.speaker_id(voice)
            with self._lock:
                if request_id in self._speech:
                    raise ValueError(f"request id {request_id!r} is already in flight")
                self._speech[request_id] = _Speech(voice, talker_params or self.talker.sampling_params(), on_event)
        timeline = timeline if voice is not None else None
        cuda = self.device.type == "cuda"

        def on_token(rid: str, token: ThinkerToken) -> None:
            if token.talker_prompt is not None:
                if cuda:
                    torch.cuda.current_stream().synchronize()   # the talker prompt is complete before it crosses
                if timeline is not None:
                    timeline.mark("first_token")
            on_event(token)

        if timeline is not None:
            self._timelines[request_id] = timeline
            timeline.mark("submitted")
        try:
            self.thinker.submit_inputs(request_id, inputs, params, on_token, embeds=False, marks=timeline)
        except Exception:
            with self._lock:
                self._speech.pop(request_id, None)
            self._timelines.pop(request_id, None)
            raise

    def speak(self, request_id: str, token: ThinkerToken, final: bool = False) -> None:
        """Give the talker a thinker token the consumer accepted, in order. The first one (index 0) starts
        the talker with its prompt; `final`: the text ends with this token (it is not spoken, as in
        `generate`). No-op for requests without a voice."""
        with self._lock:
            if request_id not in self._speech:
                return
        if token.talker_prompt is not None:
            self._talker.post(("talk", request_id, token.talker_prompt))
        ids = [] if token.token_id is None else [token.token_id]
        if ids or final:
            self._talker.post(("speak", request_id, ids, final))
        if token.talker_prompt is not None and (timeline := self._timelines.get(request_id)) is not None:
            timeline.mark("talker_posted")

    def stop(self, request_id: str) -> None:
        """The consumer ended the text early (a stop string): stop the thinker; the talker finishes speaking
        what it was given (the consumer speaks the last token with final=True)."""
        self.thinker.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Forget a request in every engine (no event follows); no-op when it already finished."""
        self.thinker.abort(request_id)
        self._timelines.pop(request_id, None)
        with self._lock:
            speech = self._speech.pop(request_id, None)
        if speech is not None:
            self._talker.post(("abort", request_id))

    # ---- talker thread -----------------------------------------------------------------------------
    def _talker_apply(self, messages: list) -> None:
        """Apply talk / speak / abort messages in order; runs of speak messages (one per thinker token and
        request) are applied together: one embedding lookup and one text projection for all of them."""
        speaks = []
        for message in messages:
            if message[0] == "speak":
                speaks.append(message[1:])
                continue
            self._talker_speak(speaks)
            speaks = []
            self._talker_control(message)
        self._talker_speak(speaks)

    def _talker_control(self, message) -> None:
        kind, rid = message[0], message[1]
        with self._lock:
            speech = self._speech.get(rid)
        if kind == "abort":
            self.talker.cancel(rid)
            self._code2wav.post(("abort", rid))
            return
        if speech is None:   # aborted meanwhile
            return
        prompt = message[2]   # "talk"
        for tensor in (prompt.prompt_embeds, prompt.mm_hidden):
            if tensor.is_cuda:
                tensor.record_stream(torch.cuda.current_stream())
        try:
            self.talker.add_request(rid, prompt, speech.voice, speech.params)
        except Exception as exc:  # noqa: BLE001 - a bad prompt: fails this request only
            self._code2wav.post(("end", rid, "error", exc if isinstance(exc, RequestError) else str(exc)))
            return
        speech.started = True

    def _talker_speak(self, speaks: list[tuple[str, list[int], bool]]) -> None:
        """(request id, token ids, final) in order -> `Talker.push_texts`, the ids of all requests looked up in
        the thinker's embedding table at once."""
        items, ids = [], []
        for rid, token_ids, final in speaks:
            with self._lock:
                speech = self._speech.get(rid)
            if speech is None:   # aborted meanwhile
                continue
            if speech.started:
                if rid not in self.talker:   # its talker already ended (codec_eos, max_frames): nothing to speak
                    continue
                items.append((rid, len(token_ids), final))
                ids += token_ids
            elif final:   # the text ended before any token reached the talker
                self._code2wav.post(("end", rid, "stop", None))
        if not items:
            return
        table = self.thinker.embed_tokens
        embeds = table(to_device(ids, torch.long, self.device)) if ids else \
            torch.zeros(0, table.embedding_dim, device=self.device)
        pushes, start = [], 0
        for rid, n, final in items:
            pushes.append((rid, embeds[start:start + n], final))
            start += n
        self.talker.push_texts(pushes)

    def _talker_work(self) -> int:
        out = self.talker.step(on_prefill=self._talker_prefilled if self._timelines else None)
        if self._timelines:
            self._mark_frames(out)
        if out:   # one message per step for all requests: the code2wav thread wakes once per frame
            self._code2wav.post(("codes", {rid: (o.codes, o.finish_reason if o.finished else None)
                                           for rid, o in out.items()}))
        return len(out)

    def _talker_prefilled(self, request_ids: Sequence[str], started: float) -> None:
        now = time.monotonic()
        for rid in request_ids:
            if (timeline := self._timelines.get(rid)) is not None:
                timeline.mark("talker_start", started)
                timeline.mark("talker_prefill", now)

    def _mark_frames(self, out: dict) -> None:
        """Mark each frame a request made before its first audio (talker thread)."""
        now = time.monotonic()
        for rid, result in out.items():
            timeline = self._timelines.get(rid)
            if timeline is None or not result.codes.shape[-1]:
                continue
            with self._lock:
                speech = self._speech.get(rid)
            if speech is not None:
                speech.frames += result.codes.shape[-1]
                timeline.frame(speech.frames, now)

    def _talker_failed(self, exc: Exception) -> None:
        log.error("talker failed:\n%s", traceback.format_exc())
        with self._lock:
            live = list(self._speech)
        for rid in live:
            self.talker.cancel(rid)
            self._code2wav.post(("end", rid, "error", f"talker: {exc}"))

    # ---- code2wav thread ---------------------------------------------------------------------------
    def _code2wav_apply(self, messages: list) -> None:
        for message in messages:
            kind = message[0]
            if kind == "codes":   # {request id: (codes [16, n], finish reason or None)} of one talker step
                for rid, (codes, reason) in message[1].items():
                    with self._lock:
                        speech = self._speech.get(rid)
                    if speech is not None:
                        speech.pending.append(codes)
                        if reason is not None:
                            speech.ending = (reason, None)
                continue
            rid = message[1]
            if kind == "abort":
                self.code2wav.cancel(rid)
                continue
            with self._lock:
                speech = self._speech.get(rid)
            if speech is not None:   # "end": (reason, error) without further frames
                speech.ending = (message[2], message[3])

    def _code2wav_busy(self) -> bool:
        with self._lock:
            return any(s.pending or s.ending for s in self._speech.values())

    def _code2wav_work(self) -> int:
        with self._lock:
            ready = {rid: s for rid, s in self._speech.items() if s.pending or s.ending}
        new, final, failed = {}, [], []
        for rid, speech in ready.items():
            if speech.ending is not None and speech.ending[1] is not None:
                failed.append(rid)
                continue
            codes = torch.cat(speech.pending, -1) if speech.pending else torch.zeros(16, 0, dtype=torch.long)
            speech.pending = []
            speech.codes.append(codes)
            if codes.shape[-1] or rid in self.code2wav:
                new[rid] = codes
                if speech.ending is not None:
                    final.append(rid)
        started = time.monotonic()
        pcm = self.code2wav.step(new, final=final) if new else {}
        if self._timelines:
            self._mark_first_audio(pcm, started)
        for rid, speech in ready.items():
            chunk = pcm.get(rid, np.zeros(0, np.float32))
            if rid in failed:
                self.code2wav.cancel(rid)
                self._finish(rid, speech, SpeechChunk(self._take_codes(speech), chunk, True, "error", speech.ending[1]))
            elif speech.ending is not None:
                self._finish(rid, speech, SpeechChunk(self._take_codes(speech), chunk, True, speech.ending[0]))
            elif chunk.size:
                speech.on_event(SpeechChunk(self._take_codes(speech), chunk))
        return sum(1 for chunk in pcm.values() if chunk.size)

    def _mark_first_audio(self, pcm: dict[str, np.ndarray], started: float) -> None:
        """Mark the decode that made a request's first PCM; its timeline leaves the engine threads (code2wav)."""
        now = time.monotonic()
        for rid, chunk in pcm.items():
            if chunk.size and (timeline := self._timelines.pop(rid, None)) is not None:
                timeline.mark("code2wav_start", started)
                timeline.mark("code2wav_end", now)

    @staticmethod
    def _take_codes(speech: _Speech) -> torch.Tensor:
        codes = torch.cat(speech.codes, -1) if speech.codes else torch.zeros(16, 0, dtype=torch.long)
        speech.codes = []
        return codes

    def _finish(self, rid: str, speech: _Speech, chunk: SpeechChunk) -> None:
        with self._lock:
            if self._speech.get(rid) is not speech:   # aborted meanwhile
                return
            del self._speech[rid]
        self._timelines.pop(rid, None)
        speech.on_event(chunk)

    def _code2wav_failed(self, exc: Exception) -> None:
        """A failed decode leaves the streamer's state of its batch unknown: every live request fails (and
        the talker forgets it)."""
        log.error("code2wav failed:\n%s", traceback.format_exc())
        with self._lock:
            live = list(self._speech.items())
        for rid, speech in live:
            self.code2wav.cancel(rid)
            self._talker.post(("abort", rid))
            self._finish(rid, speech, SpeechChunk(torch.zeros(16, 0, dtype=torch.long), np.zeros(0, np.float32),
                                                  True, "error", f"code2wav: {exc}"))

    # ---- all requests at once (tests, benchmarks) ----------------------------------------------------
    def run(self, requests: Sequence["OmniRequest"]) -> dict[str, "OmniResult"]:
        """Run all requests together until each has its text and audio (each result's `first_audio` timeline
        from its arrival here to its first chunk read). Raises RuntimeError with the failing stage's error text
        when a request fails."""
        events: queue.SimpleQueue = queue.SimpleQueue()
        results = {r.request_id: OmniResult(codes=torch.zeros(16, 0, dtype=torch.long),
                                            first_audio=FirstAudioTimeline(self.code2wav.first_chunk_frames))
                   for r in requests}
        for r in requests:
            inputs = self.thinker.prompts.build(r.messages, r.audios, r.images)
            self.submit(r.request_id, inputs, r.thinker_params,
                        lambda event, rid=r.request_id: events.put((rid, event)), voice=r.voice,
                        talker_params=r.talker_params, timeline=results[r.request_id].first_audio)
        text_open, audio_open = set(results), {r.request_id for r in requests if r.voice is not None}
        while text_open or audio_open:
            rid, event = events.get()
            result = results[rid]
            if event.error is not None:
                self.abort(rid)
                raise RuntimeError(f"request {rid} failed: {event.error}")
            if isinstance(event, ThinkerToken):
                if event.token_id is not None:
                    result.token_ids.append(event.token_id)
                if event.index == 0:
                    result.first_audio.mark("token_read")
                self.speak(rid, event, final=event.finished)
                if event.finished:
                    result.finish_reason = event.finish_reason
                    text_open.discard(rid)
                continue
            result.codes = torch.cat([result.codes, event.codes], -1)
            if event.pcm.size:
                result.first_audio.mark("audio_read")
                result.first_audio.mark("audio_sent")   # nothing to send in process
                result.chunks.append(event.pcm)
            if event.finished:
                audio_open.discard(rid)
        return results


@dataclass
class OmniRequest:
    """One chat turn: messages, audios and images as `PromptBuilder.build`; per-stage sampling parameters
    (`Thinker.sampling_params`, `Talker.sampling_params`); voice: a checkpoint speaker name."""

    request_id: str
    messages: Sequence[dict]
    thinker_params: SamplingParams
    talker_params: SamplingParams
    voice: str = "ethan"
    audios: Sequence[np.ndarray] = ()
    images: Sequence[np.ndarray] = ()


@dataclass
class OmniResult:
    """token_ids: generated thinker ids; codes: int64 [16, frames]; audio: float32 [samples] at 24 kHz
    (the streamed chunks, in `chunks`, concatenated); finish_reason of the thinker; first_audio: the request's
    `FirstAudioTimeline` (complete once its first chunk was read)."""

    token_ids: list[int] = field(default_factory=list)
    codes: torch.Tensor | None = None
    chunks: list[np.ndarray] = field(default_factory=list)
    finish_reason: str | None = None
    first_audio: FirstAudioTimeline | None = None

    @property
    def audio(self) -> np.ndarray:
        """float32 [samples] at 24 kHz: all streamed chunks concatenated."""
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
