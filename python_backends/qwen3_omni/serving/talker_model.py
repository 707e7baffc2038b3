"""qwen3_omni_talker: the talker as a stateful streaming stage (sequence batching, decoupled).

One sequence (correlation id) is one chat turn. Each request brings the thinker embeddings that are
new since the previous request (the first one, flagged START, also the talker prompt and params; the
last, flagged END, completes the text). `execute` only enqueues; one worker thread owns the `Talker`
and advances ALL live sequences together (`Talker.step`: the code predictor runs batched), streams
each frame to the request that fed its text, and ends that request (FINAL) as soon as its sequence
needs more text — the talker waits for the thinker, it never pads. A sequence ends with codec_eos or
max_frames (FINISH_REASON on its last response; this can come before the END request, and the orchestrator then
sends an ABORT flagged END at once, so that Triton frees the sequence's slot), on ABORT, or when its live request is
cancelled, or after `max_sequence_idle_microseconds` (the config's sequence-batching idle timeout,
after which Triton itself frees the sequence's slot) without a request, or within about a second once
the BLS parent that started it is gone (its stub crashed or was reloaded: `SequenceLeases`). At most
`max_sequences` (config parameter, default 256) are live: a START beyond them is refused at once (429
`too_many_sequences`). Tensors: `omni_backends.qwen3_omni.serving.protocol`.

The worker is supervised: if it crashes, every live sequence ends with a 503 error on its open
request, the talker starts empty and a new worker thread takes over (omni_model_healthy is 0 meanwhile).
Metrics (`StageMetrics`): in-flight = live sequences; outcomes per sequence; queue time (request ->
applied by the worker) and step time (phase "step").
"""
from __future__ import annotations

import queue
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from omni_backends.errors import RequestError, unavailable
from omni_backends.qwen3_omni.loading import load_config, load_talker, load_tts_embeds
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.qwen3_omni.serving import turn as turns
from omni_backends.qwen3_omni.talker import Talker, TalkerPrompt
from omni_backends.serving import events, model_config, sidechannel
from omni_backends.serving.decoupled import send_final, send_response
from omni_backends.serving.metrics import StageMetrics
from omni_backends.serving.sequences import SequenceLeases, check_room
from omni_backends.serving.tensors import from_triton, on_gpu
from omni_backends.supervisor import Supervisor

CANCEL_POLL_S = 0.02
IDLE_SWEEP_S = 1.0
_STOP = object()


@dataclass
class _Command:
    sequence: int | str   # the correlation id
    sender: object
    request_id: str
    start: bool
    end: bool
    abort: bool
    embeds: torch.Tensor | None
    prompt: TalkerPrompt | None = None
    params: dict | None = None
    received: float = 0.0


def _float_tensor(value) -> torch.Tensor:
    """A float32 torch tensor of an input: CUDA tensors stay where they are, numpy arrays are copied."""
    return value.float() if on_gpu(value) else torch.from_numpy(np.array(value, np.float32))


def _long_tensor(value) -> torch.Tensor:
    """An int64 CPU torch tensor of an input (prompt ids, image grids), copied off the GPU when it is there."""
    return value.long().cpu() if on_gpu(value) else torch.from_numpy(np.array(value, np.int64))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.model_name, config, parameters = model_config.load(args)
        setup = p.stage_setup(args, parameters, self.model_name)
        omni_config = load_config(setup.path)
        self.talker = Talker(load_talker(setup.path, omni_config, setup.device, setup.dtype), omni_config,
                             load_tts_embeds(setup.path, omni_config, setup.device, setup.dtype), options=setup.options,
                             max_running=model_config.int_parameter(parameters, "max_running", 32))
        self.talker.warmup()
        self.max_frames = model_config.int_parameter(parameters, "max_frames", 4095)
        self.max_sequences = model_config.int_parameter(parameters, "max_sequences", 256)
        self.metrics = StageMetrics(self.model_name)
        self._commands: queue.Queue = queue.Queue()
        self._sequences: set[int | str] = set()           # live sequences (START seen, not ended)
        self._live: dict[int | str, tuple[object, str]] = {}   # sequence -> (sender, request id) of its open request
        self.leases = SequenceLeases(model_config.sequence_idle_seconds(config))
        self._worker = Supervisor(f"{self.model_name}-worker", self._run, self._crashed,
                                  self.metrics.set_healthy).start()

    def execute(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._commands.put(self._parse(request, sender))
            except Exception as exc:  # noqa: BLE001 - a bad request must not take the model down
                message = exc.envelope() if isinstance(exc, RequestError) else f"{self.model_name}: {exc}"
                send_final(sender, request.request_id(), message)
        return None

    def finalize(self) -> None:
        self._commands.put(_STOP)
        self._worker.join(timeout=10)
        self.metrics.close()

    # -- request parsing (Triton thread) ----------------------------------------------------------
    def _parse(self, request, sender) -> _Command:
        def tensor(name):
            found = pb_utils.get_input_tensor_by_name(request, name)
            return None if found is None else from_triton(found)[0]   # drop the batch dim

        embeds = tensor(p.TEXT_EMBEDS)
        abort = p.flag(tensor(p.ABORT))
        if embeds is None and not abort:
            raise RequestError(f"{p.TEXT_EMBEDS} is required (it may hold 0 rows)")
        if embeds is not None:
            self.metrics.tensor(p.TEXT_EMBEDS, "in", on_gpu(embeds))
        command = _Command(sequence=request.correlation_id(), sender=sender, request_id=request.request_id(),
                           start=p.flag(tensor(p.START)), end=p.flag(tensor(p.END)), abort=abort,
                           embeds=None if embeds is None else _float_tensor(embeds), received=time.monotonic())
        if command.start and not command.abort:
            if any(tensor(name) is None for name in (*p.PROMPT_TENSORS, p.TALKER_PARAMS)):
                raise RequestError(f"the START request needs {', '.join((*p.PROMPT_TENSORS, p.TALKER_PARAMS))}")
            command.prompt = TalkerPrompt(prompt_ids=_long_tensor(tensor(p.PROMPT_IDS)),
                                          prompt_embeds=_float_tensor(tensor(p.PROMPT_EMBEDS)),
                                          mm_hidden=_float_tensor(tensor(p.MM_HIDDEN)),
                                          image_grid_thw=_long_tensor(tensor(p.IMAGE_GRID_THW)))
            command.params = events.read_json(tensor(p.TALKER_PARAMS))
        return command

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        last_sweep = time.monotonic()
        while True:
            try:
                if self.talker.has_ready():
                    command = self._commands.get_nowait()
                else:   # idle: wait for text, polling cancellation while a request is open
                    timeout = CANCEL_POLL_S if self._live else IDLE_SWEEP_S if self._sequences else None
                    command = self._commands.get(timeout=timeout)
            except queue.Empty:
                command = None
            while command is not None:
                if command is _STOP:
                    return
                self._apply(command)
                command = self._commands.get_nowait() if not self._commands.empty() else None
            self._poll_cancelled()
            if time.monotonic() - last_sweep >= IDLE_SWEEP_S:
                last_sweep = time.monotonic()
                self._sweep_idle()
            if self.talker.has_ready():
                self._step()

    def _crashed(self, exc: BaseException) -> None:
        """Supervisor recovery: every sequence ends with a retryable 503 error; the talker starts empty."""
        error = unavailable(f"{self.model_name}: worker failure ({type(exc).__name__}: {exc}); retry the request")
        for seq in set(self._sequences) | set(self._live):
            self._end_sequence(seq, "error", error.envelope())
        self.talker.reset()

    def _sweep_idle(self) -> None:
        """End sequences without an open request that got none for the idle timeout (Triton has freed
        their slots by then) or whose BLS parent is gone."""
        for seq, why in self.leases.expired(busy=self._live).items():
            pb_utils.Logger.log_warn(f"{self.model_name}: sequence {seq} ended ({why})")
            self._end_sequence(seq, "cancelled")

    def _apply(self, command: _Command) -> None:
        seq = command.sequence
        self.metrics.observe("queue", time.monotonic() - command.received)
        self.leases.touch(seq, command.request_id)
        try:
            if command.abort:
                self._end_sequence(seq, "cancelled")
                send_final(command.sender, command.request_id)
                return
            if command.start:
                if seq not in self._sequences:
                    check_room(self.model_name, len(self._sequences), self.max_sequences)
                self.talker.add_request(seq, command.prompt, str(command.params.get("voice") or ""),
                                        turns.talker_sampling(self.talker, command.params, self.max_frames))
                self._sequences.add(seq)
                self.metrics.started()
            elif seq not in self._sequences:
                raise RequestError(f"talker sequence {seq} is not live (send START first)")
            if len(command.embeds) or command.end:
                self.talker.push_text(seq, command.embeds, final=command.end)
        except Exception as exc:  # noqa: BLE001 - fail this request (and its sequence) only
            self._end_sequence(seq, "rejected" if isinstance(exc, RequestError) else "error")
            send_final(command.sender, command.request_id,
                       exc.envelope() if isinstance(exc, RequestError) else f"{self.model_name}: {exc}")
            return
        self._live[seq] = (command.sender, command.request_id)
        self._close_waiting()

    def _step(self) -> None:
        started = time.monotonic()
        try:
            outputs = self.talker.step()
        except Exception as exc:  # noqa: BLE001 - a model failure fails every live sequence
            pb_utils.Logger.log_error(f"{self.model_name} step failed:\n{traceback.format_exc()}")
            for seq in list(self._live):
                self._end_sequence(seq, "error", f"{self.model_name}: {exc}")
            return
        self.metrics.observe("step", time.monotonic() - started)
        for seq, out in outputs.items():
            sender, request_id = self._live[seq]   # a sequence only advances while its request is open
            tensors = [pb_utils.Tensor(p.CODES, out.codes.numpy().astype(np.int64)[None])]
            if out.finished:
                tensors.append(pb_utils.Tensor(p.FINISH_REASON, np.array([[out.finish_reason.encode()]],
                                                                         dtype=np.object_)))
            if not sidechannel.stop_requested(request_id, sender.is_cancelled):
                send_response(sender, request_id, pb_utils.InferenceResponse(tensors))
            if out.finished:
                self._end_sequence(seq, "ok")
        self._close_waiting()

    def _close_waiting(self) -> None:
        """End (FINAL) the open request of every sequence that waits for more thinker text."""
        for seq in [s for s in self._live if s in self._sequences and not self.talker.ready(s)]:
            sender, request_id = self._live.pop(seq)
            send_final(sender, request_id)

    def _poll_cancelled(self) -> None:
        for seq, (sender, request_id) in list(self._live.items()):
            if sidechannel.stop_requested(request_id, sender.is_cancelled):
                sidechannel.clear(request_id)
                self._end_sequence(seq, "cancelled")

    def _end_sequence(self, seq: int | str, outcome: str, error: str | None = None) -> None:
        """Forget a sequence, count its outcome, and end its open request (if any)."""
        self.leases.forget(seq)
        if seq in self._sequences:
            self._sequences.discard(seq)
            self.talker.cancel(seq)
            self.metrics.finished(outcome)
        live = self._live.pop(seq, None)
        if live is not None:
            send_final(live[0], live[1], error)
