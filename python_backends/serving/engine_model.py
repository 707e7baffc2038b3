"""Base class for engine stages (autoregressive: thinker, LLM): decoupled, `max_batch_size: 0`,
continuous batching in an `omni_backends.engine.EngineLoop` thread (the vLLM-backend shape).

`execute` only parses and enqueues; the engine thread hands every StepOutput to a queue; a sender
thread turns outputs into responses (so the forward loop never waits on IPC) and polls each live
request's `is_cancelled()` (and its BLS cancel flag, omni_backends.serving.sidechannel) every
CANCEL_POLL_S, aborting it in the engine; the engine also asks each request before every prefill
step, so a request abandoned while it waits never costs a prefill. Every request ends with
FINAL: after its last token, after an error response, or after cancellation.

Both threads are supervised (`omni_backends.supervisor`): if the engine loop crashes anyway,
its requests in flight get a 503 error (OpenAI envelope), `omni_model_healthy` drops to 0 (so the
frontend's /health answers 503 naming this model), and a fresh loop thread takes over after a short
backoff; requests arriving meanwhile get 503 at once. Timing histograms: see serving.metrics.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backends.batch_loop import LoopUnavailable
from omni_backends.engine import EngineLoop, Prompt, SamplingParams, StepOutput
from omni_backends.errors import RequestError, unavailable
from omni_backends.serving import model_config, sidechannel
from omni_backends.serving.decoupled import send_final, send_response
from omni_backends.serving.metrics import StageMetrics
from omni_backends.serving.tensors import to_triton
from omni_backends.supervisor import Supervisor

CANCEL_POLL_S = 0.02
_STOP = object()


class EngineStageModel:
    """Subclass and implement:

    - `build_loop(args) -> EngineLoop` (load the model, make the runner; any BatchLoop with the same
      `submit(id, prompt, params, on_output, cancelled=)` / `abort(id)` / `shutdown(timeout)` and outputs
      carrying `finished`, `finish_reason`, `error`, `unavailable` fits, e.g.
      omni_backends.diffusion.DenoiseLoop);
    - `make_prompt(request) -> (Prompt, SamplingParams, context)`: parse one Triton request; raise
      RequestError for bad input; `context` is any per-request object passed back below; or a dict of
      output tensors: the request's only response, for a control REQUEST answered without the engine
      (e.g. voice_llm's {"action": "prompt_tokens"}), sent with FINAL at once;
    - `encode(context, output) -> dict[name, np.ndarray | torch.Tensor]`: tensors of one output's
      response (CUDA torch tensors go out through DLPack; return None to send nothing for this output);
    - optionally `finished(context) -> bool`: True once the request is complete before the engine
      says so (e.g. a stop string matched): it is aborted in the engine and gets FINAL at once.
    """

    def initialize(self, args: dict) -> None:
        self.model_name, self.model_config, self.parameters = model_config.load(args)
        model_config.apply_nice(self.parameters)
        self.metrics = StageMetrics(self.model_name)
        self.loop = self.build_loop(args)
        self.loop.observe = self.metrics.observe
        self.loop.on_health = self.metrics.set_healthy  # an engine crash / its restart (omni_model_healthy)
        self._outputs: queue.Queue = queue.Queue()
        self._live: dict[str, tuple] = {}  # engine id -> (sender, context, triton request id)
        self._lock = threading.Lock()
        self._next_id = 0
        self._sender = Supervisor(f"{self.model_name}-sender", self._send_loop, lambda exc: None).start()

    # -- to implement -------------------------------------------------------------------------
    def build_loop(self, args: dict) -> EngineLoop:
        raise NotImplementedError

    def make_prompt(self, request) -> tuple[Prompt, SamplingParams, object] | dict:
        raise NotImplementedError

    def encode(self, context, output: StepOutput) -> dict[str, np.ndarray] | None:
        raise NotImplementedError

    def finished(self, context) -> bool:
        return False

    # -- Triton entry points ------------------------------------------------------------------
    def execute(self, requests) -> None:
        for request in requests:
            sender, triton_id = request.get_response_sender(), request.request_id()
            self._next_id += 1
            rid = f"{triton_id or 'req'}#{self._next_id}"
            self.metrics.started()
            try:
                made = self.make_prompt(request)
                if isinstance(made, dict):  # a control request, answered here
                    send_response(sender, triton_id, pb_utils.InferenceResponse([to_triton(k, v) for k, v in made.items()]))
                    self.metrics.finished("ok")
                    send_final(sender, triton_id)
                    continue
                prompt, params, context = made
                with self._lock:  # registered before submit: the first output may come at once
                    self._live[rid] = (sender, context, triton_id)
                self.loop.submit(rid, prompt, params, self._on_output,
                                 cancelled=lambda s=sender, t=triton_id: sidechannel.stop_requested(t, s.is_cancelled))
            except Exception as exc:  # noqa: BLE001 - raising here would free the sender under our threads
                with self._lock:
                    self._live.pop(rid, None)
                if isinstance(exc, LoopUnavailable):
                    exc = unavailable(f"{self.model_name}: {exc}")
                rejected = isinstance(exc, RequestError) and exc.status < 500
                self.metrics.finished("rejected" if rejected else "error")
                send_final(sender, triton_id, exc.envelope() if isinstance(exc, RequestError) else f"{self.model_name}: {exc}")
        return None

    def finalize(self) -> None:
        self.loop.shutdown(timeout=10)
        self._outputs.put(_STOP)
        self._sender.join(timeout=10)
        self.metrics.close()

    # -- engine thread -> sender thread ---------------------------------------------------------
    def _on_output(self, rid: str, output: StepOutput) -> None:
        self._outputs.put((rid, output))

    def _send_loop(self) -> None:
        last_poll = 0.0
        while True:
            try:
                item = self._outputs.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            if item is not None:
                self._handle(*item)
            if time.monotonic() - last_poll >= CANCEL_POLL_S:
                last_poll = time.monotonic()
                with self._lock:
                    live = list(self._live.items())
                for rid, (sender, _, triton_id) in live:
                    if sidechannel.stop_requested(triton_id, sender.is_cancelled):
                        self.loop.abort(rid)

    def _handle(self, rid: str, output: StepOutput) -> None:
        with self._lock:
            entry = self._live.get(rid)
        if entry is None:
            return
        sender, context, triton_id = entry
        error = None
        try:
            if output.finish_reason == "error":
                if output.unavailable:
                    raise unavailable(f"{self.model_name}: {output.error}")
                raise RuntimeError(output.error or "engine error")
            tensors = self.encode(context, output)
            if tensors and not sidechannel.stop_requested(triton_id, sender.is_cancelled):
                send_response(sender, triton_id, pb_utils.InferenceResponse([to_triton(k, v) for k, v in tensors.items()]))
            if not output.finished and self.finished(context):
                self.loop.abort(rid)  # its abort output arrives later and is ignored
                output = StepOutput(token_id=None, finished=True, finish_reason="stop")
        except Exception as exc:  # noqa: BLE001 - report, then finish this request only
            if not output.unavailable:
                pb_utils.Logger.log_error(f"{self.model_name} {rid}: {traceback.format_exc()}")
            self.loop.abort(rid)
            output = StepOutput(token_id=None, finished=True, finish_reason="error", error=str(exc))
            error = exc.envelope() if isinstance(exc, RequestError) else f"{self.model_name}: {exc}"
        if output.finished:
            with self._lock:
                del self._live[rid]
            sidechannel.clear(triton_id)
            outcome = {"abort": "cancelled", "error": "error"}.get(output.finish_reason or "", "ok")
            self.metrics.finished(outcome)
            send_final(sender, triton_id, error)
