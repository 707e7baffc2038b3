"""qwen3_omni, co-located layout: the client-facing Qwen3-Omni model with all three engines in this process.

The stage layout runs the thinker, talker and code2wav as separate Triton models (separate stub processes)
wired by the BLS orchestrator (`omni_model`). On one GPU those processes time-slice the device: CUDA runs
kernels of different processes one context at a time (without MPS), so a served thinker step costs its own
time plus a talker frame (docs/gpu.md, H200 run 2). Here the engines share one process: the thinker's
engine thread, the talker thread and the code2wav thread each run on their own CUDA stream
(`LocalOmniPipeline`), so their kernels overlap, and tokens, hidden states and frames cross between them as
in-process objects instead of BLS responses (no per-token JSON, IPC or DLPack hand-offs between stages).

Same tensors and events as the orchestrator (REQUEST / INPUT_AUDIO / INPUT_IMAGES / INPUT_IMAGE_SIZES in; EVENT
JSON + AUDIO out, see `omni_model`), so clients and the frontend see no difference; a deploy file selects it with
`layout: colocated` (omni_frontend.deploy) and serves it under the name qwen3_omni; it answers the token control
REQUESTs (`omni_backends.serving.token_actions`) from its thinker's tokenizer. Settings: shared
`checkpoint`, `kernels`, `threads`, `default_voice`, `switch_interval_ms` (the process's GIL switch interval,
default `pipeline.ENGINE_SWITCH_INTERVAL_S`), `sm_split` (e.g. `thinker:88,talker:44`: the engine threads' SMs as
disjoint CUDA green contexts, `engine.sm_split`; empty or off: off, the default, as runs 24-25 found no gain;
validated and ignored on the CPU); each engine's as `<stage>.<key>` with the stage models' keys (`thinker.engine`,
`thinker.max_len`, `talker.max_frames`, `code2wav.chunk_frames`, ...).

Per request one coroutine reads the engines' events from a mailbox (one event-loop wake-up per batch of
events, text deltas of one batch merged into one event), runs the text stream (detokenizing, stop strings),
hands the accepted tokens to the talker, and streams text and audio events; a cancelled or failed request
is aborted in every engine.

First audio: each request with a voice carries a `FirstAudioTimeline` (`first_audio`: arrival, thinker prefill,
hand-offs, talker prefill, frames, code2wav, sent); once its first audio event is sent, its phases go to the
histogram `omni_first_audio_phase_seconds{model, phase}` and, with the environment variable
`OMNI_FIRST_AUDIO_LOG=1`, to one `first_audio id=... ttfp_ms=... <phase>=<ms> ...` line in the server log.

Steady state: with the environment variable `OMNI_STEP_LOG=FILE`, every step of the three engine threads goes to FILE
as one line (its wait, apply, work and CPU time, rows, live requests), with GIL probe and per-thread CPU lines
(`step_profile`); without it nothing is recorded.
"""
from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer, WhisperFeatureExtractor

from omni_backends.engine import sm_split
from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.code2wav import SAMPLE_RATE, Code2WavStreamer
from omni_backends.qwen3_omni.first_audio import FirstAudioTimeline
from omni_backends.qwen3_omni.loading import load_code2wav, load_config, load_image_processor, load_talker, \
    load_thinker
from omni_backends.qwen3_omni.pipeline import ENGINE_SWITCH_INTERVAL_S, LocalOmniPipeline
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.qwen3_omni.serving import turn as turns
from omni_backends.qwen3_omni.step_profile import StepProfile
from omni_backends.qwen3_omni.talker import Talker
from omni_backends.qwen3_omni.thinker import Thinker, ThinkerToken
from omni_backends.serving import events, model_config, token_actions
from omni_backends.serving.decoupled import AsyncDecoupledModel

CANCEL_POLL_S = 0.05


class Mailbox:
    """Events from engine threads to one request coroutine: `put` from any thread; `get(timeout)` waits up to
    `timeout` seconds and returns every event queued so far, in order (an empty list on timeout). The event
    loop is woken once per batch, not once per event."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._lock = loop, threading.Lock()
        self._items: list = []
        self._ready = asyncio.Event()
        self._woken = False

    def put(self, item) -> None:
        with self._lock:
            self._items.append(item)
            wake, self._woken = not self._woken, True
        if wake:
            self._loop.call_soon_threadsafe(self._ready.set)

    async def get(self, timeout: float) -> list:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            pass
        with self._lock:
            items, self._items = self._items, []
            self._woken = False
            self._ready.clear()
        return items


class TritonPythonModel(AsyncDecoupledModel):
    request_fields, control_actions = turns.REQUEST_FIELDS, ("voices", *token_actions.ACTIONS)

    def setup(self, args: dict) -> None:
        # three engine threads and the request coroutines share the GIL: hand it over in 0.5 ms, not Python's 5 ms
        sys.setswitchinterval(float(self.parameters.get("switch_interval_ms") or ENGINE_SWITCH_INTERVAL_S * 1e3) / 1e3)
        settings = {stage: p.stage_parameters(self.parameters, stage) for stage in ("thinker", "talker", "code2wav")}
        setups = {stage: p.stage_setup(args, params, self.model_name) for stage, params in settings.items()}
        path, device = setups["thinker"].path, setups["thinker"].device
        partitions = sm_split.from_setting(self.parameters.get("sm_split"), device)
        config = load_config(path)
        thinker_params, talker_params, code2wav_params = settings["thinker"], settings["talker"], settings["code2wav"]
        thinker = Thinker(load_thinker(path, config, device, setups["thinker"].dtype), config,
                          AutoTokenizer.from_pretrained(path), WhisperFeatureExtractor.from_pretrained(path),
                          max_running=model_config.int_parameter(thinker_params, "max_running", 32),
                          options=setups["thinker"].options, partition=partitions.get("thinker"),
                          image_processor=load_image_processor(path),
                          stream=None if device == "cpu" else
                          partitions["thinker"].stream() if "thinker" in partitions else torch.cuda.Stream(device))
        tts_ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
        with torch.inference_mode():   # the thinker's own rows: no second read of the embedding table
            tts_embeds = thinker.embed_tokens(torch.tensor(tts_ids, device=device))
        talker = Talker(load_talker(path, config, device, setups["talker"].dtype), config, tts_embeds,
                        options=setups["talker"].options,
                        max_running=model_config.int_parameter(talker_params, "max_running", 32))
        code2wav = Code2WavStreamer(
            load_code2wav(path, config, device, setups["code2wav"].dtype),
            **p.code2wav_settings(code2wav_params, model_config.int_parameter(talker_params, "max_running", 32),
                                  prefix="code2wav."))
        thinker.warmup()
        with sm_split.within(partitions.get("talker")):
            talker.warmup()
        with sm_split.within(partitions.get("code2wav")):
            code2wav.warmup()
        step_log = os.environ.get("OMNI_STEP_LOG")
        self.pipeline = LocalOmniPipeline(thinker, talker, code2wav, StepProfile(step_log) if step_log else None,
                                          partitions)
        self.voices = talker.voices
        self.default_voice = self.parameters.get("default_voice") or self.voices[0]
        self.default_max_tokens = model_config.int_parameter(thinker_params, "max_tokens", 256)
        self.max_frames = model_config.int_parameter(talker_params, "max_frames", 4095)
        self.log_first_audio = os.environ.get("OMNI_FIRST_AUDIO_LOG", "") not in ("", "0")
        self._next_id = 0

    def teardown(self) -> None:
        self.pipeline.close()

    async def handle(self, ctx):
        arrival = time.monotonic()
        body = ctx.body()
        if events.wants_voices(body):
            yield events.voices_event(self.voices, self.default_voice, body,
                                      lambda v: turns.resolve_voice(v, self.voices)), None
            return
        if body.get("action") in token_actions.ACTIONS:
            yield turns.token_action(self.pipeline.thinker, body, self.default_max_tokens), None
            return
        media = turns.media_inputs(ctx.input)
        modalities, voice = turns.validate(body, self.voices, self.default_voice, media)
        pipeline = self.pipeline
        inputs, params, text = turns.thinker_request(pipeline.thinker, body, media, self.default_max_tokens)
        talker_params = None if voice is None else turns.talker_sampling(
            pipeline.talker, turns.talker_fields(body, voice), self.max_frames)
        turn, send_text = turns.Turn(body, voice), "text" in modalities
        mailbox = Mailbox(asyncio.get_running_loop())
        self._next_id += 1
        rid = f"{ctx.request_id or 'req'}#{self._next_id}"
        timeline = None if voice is None else FirstAudioTimeline(pipeline.code2wav.first_chunk_frames, arrival)
        pipeline.submit(rid, inputs, params, mailbox.put, voice=voice, talker_params=talker_params,
                        timeline=timeline)
        text_open, speech_open = True, voice is not None
        try:
            while text_open or speech_open:
                batch = await mailbox.get(CANCEL_POLL_S)
                read = time.monotonic()
                ctx.check()
                pending = []   # text of this batch not yet sent
                for event in batch:
                    if isinstance(event, ThinkerToken):
                        if event.index == 0 and timeline is not None:
                            timeline.mark("token_read", read)
                        if text_open:
                            text_open = self._on_token(rid, event, text, turn, pending)
                        continue
                    if event.error is not None:   # a talker's RequestError reaches the client as it is (a 4xx)
                        raise event.error if isinstance(event.error, RequestError) else RuntimeError(event.error)
                    turn.frames += event.codes.shape[-1]
                    speech_open = not event.finished
                    if event.pcm.size:
                        if pending and send_text:
                            yield {"type": "text.delta", "text": "".join(pending)}, None
                        pending = []
                        if timeline is not None:
                            timeline.mark("audio_read", read)
                        turn.audio_sent = True
                        yield {"type": "audio.delta", "sample_rate": SAMPLE_RATE,
                               "transcript": turn.take_transcript()}, event.pcm
                        if timeline is not None:   # resumed after the sender took the event
                            self._report_first_audio(rid, timeline)
                            timeline = None
                if pending and send_text:
                    yield {"type": "text.delta", "text": "".join(pending)}, None
            if voice and (last := turn.last_audio(SAMPLE_RATE)) is not None:   # unspoken text, or no audio at all
                yield last
            yield turn.done_event(), None
        finally:
            pipeline.abort(rid)   # no-op once finished; a cancelled or failed turn stops every engine

    def _report_first_audio(self, rid: str, timeline: FirstAudioTimeline) -> None:
        """The first audio event of `rid` was sent: its phases to the metrics (and the log, when asked)."""
        timeline.mark("audio_sent")
        if not timeline.complete():   # cannot happen on the paths above; never fail a request over a metric
            return
        self.metrics.first_audio(timeline.phases())
        if self.log_first_audio:
            pb_utils.Logger.log_info(timeline.line(rid))

    def _on_token(self, rid: str, token: ThinkerToken, text, turn: turns.Turn, pending: list) -> bool:
        """Account one thinker token, give it to the talker; returns whether the text goes on."""
        if token.finish_reason == "error":
            raise RuntimeError(f"thinker: {token.error}")
        if token.token_id is not None:
            turn.token_ids.append(token.token_id)
        delta = text.step(token)
        ended = delta is not None and delta.finished
        self.pipeline.speak(rid, token, final=ended)
        if delta is not None and delta.text:
            pending.append(delta.text)
            if turn.voice is not None:
                turn.unspoken.append(delta.text)
        if not ended:
            return True
        turn.finish_reason = delta.finish_reason
        turn.usage = {"prompt_tokens": delta.usage.prompt_tokens, "completion_tokens": delta.usage.completion_tokens}
        if not token.finished:   # a stop string ended the text: the thinker stops here
            self.pipeline.stop(rid)
        return False
