"""EngineLoop: a background thread that continuously batches all live requests of one runner.

Each iteration: apply pending aborts, admit waiting requests (prefill: their first token), apply
aborts again, then ONE decode forward for every live request (the just-admitted ones included), sample each row with its own params, and call
each request's `on_output`. The thread sleeps on a Condition while nothing is live.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from omni_backends.batch_loop import BatchLoop
from omni_backends.engine.request import EngineRequest, FinishReason, OnOutput, Prompt, StepOutput
from omni_backends.engine.runner import Runner, RowOutput
from omni_backends.engine.sampling import SamplingParams, sample_next_token

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineStats:
    """Counters of an EngineLoop.

    Fields:
        in_flight: requests submitted and not yet finished (waiting + running).
        running: requests holding a KV cache in the runner.
        waiting: requests submitted but not yet prefilled.
        steps: forwards run so far (prefill and decode).
        generated_tokens: tokens emitted so far.
    """

    in_flight: int
    running: int
    waiting: int
    steps: int
    generated_tokens: int


class EngineLoop(BatchLoop):
    """Owns a runner on a background thread; thread-safe submit/abort (omni_backends.batch_loop).

    Args:
        runner: the model runner (see `omni_backends.engine.runner.Runner`).
        max_running: most requests decoded together; more wait in FIFO order.
        name: thread name.

    `on_output(request_id, StepOutput)` is called on the engine thread, once per generated token and
    exactly once with `finished=True` per request; keep it fast (hand off to a queue). If it raises,
    that request is aborted. A runner error finishes the affected requests with finish_reason "error".
    """

    def __init__(self, runner: Runner, *, max_running: int = 32, name: str = "engine-loop") -> None:
        self.runner = runner
        self._steps = 0
        self._tokens = 0
        super().__init__(max_running=max_running, name=name)

    # ---- public, thread-safe -------------------------------------------------------------------

    def submit(self, request_id: str, prompt: Prompt, params: SamplingParams, on_output: OnOutput) -> None:
        """Queue a request; it joins the batch at the next iteration.

        Raises:
            ValueError: when request_id is already in flight.
            RuntimeError: after shutdown().
        """
        self._enqueue(EngineRequest(request_id, prompt, params, on_output))

    def stats(self) -> EngineStats:
        """Current counters (see EngineStats)."""
        with self._cond:
            return EngineStats(
                in_flight=len(self._in_flight),
                running=len(self._running),
                waiting=len(self._waiting),
                steps=self._steps,
                generated_tokens=self._tokens,
            )

    # ---- engine thread -------------------------------------------------------------------------

    def _iterate(self, admitted: list[EngineRequest]) -> None:
        if admitted:
            self._forward(admitted, prefill=True)
        self._apply_aborts()
        if self._running:
            self._forward(list(self._running.values()), prefill=False)

    def _forward(self, requests: list[EngineRequest], prefill: bool) -> None:
        """Run one prefill or decode forward for `requests`, then sample and emit per request."""
        try:
            if prefill:
                rows = self.runner.prefill(requests)
            else:
                tokens = torch.tensor([r.output_ids[-1] for r in requests], dtype=torch.long)
                rows = self.runner.decode(requests, tokens)
        except Exception as exc:  # the engine must survive a bad request or model error
            log.exception("runner %s failed", "prefill" if prefill else "decode")
            self._finish_all(requests if prefill else list(self._running.values()), "error", repr(exc))
            return
        with self._cond:
            self._steps += 1
        for request, row in zip(requests, rows):
            self._emit_token(request, row)

    def _emit_token(self, request: EngineRequest, row: RowOutput) -> None:
        params = request.params
        with self._cond:
            if request.request_id in self._aborts:
                return  # aborted during the forward: _apply_aborts sends its final output
        seen = request.seen_token_ids() if params.repetition_penalty != 1.0 else None
        token = sample_next_token(row.logits, params, seen, len(request.output_ids), request.generator)
        request.output_ids.append(token)
        reason: FinishReason | None = None
        if token in params.stop_token_ids:
            reason = "stop"
        elif len(request.output_ids) >= params.max_tokens:
            reason = "length"
        output = StepOutput(
            token_id=token,
            index=len(request.output_ids) - 1,
            hidden_states=row.hidden_states,
            finished=reason is not None,
            finish_reason=reason,
        )
        with self._cond:
            self._tokens += 1
        if reason is not None:
            self._retire(request)
        self._call(request, output)

    def _finish_aborted(self, requests: Sequence[EngineRequest]) -> None:
        self._finish_all(requests, "abort")

    def _finish_all(self, requests: Sequence[EngineRequest], reason: FinishReason, error: str | None = None) -> None:
        for request in requests:
            self._retire(request)
            self._call(request, StepOutput(token_id=None, finished=True, finish_reason=reason, error=error))

    def _retire(self, request: EngineRequest) -> None:
        """Free the request's cache and drop it from the counters (before its final callback)."""
        if self._release(request):
            self.runner.release([request.request_id])

    def _call(self, request: EngineRequest, output: StepOutput) -> None:
        try:
            request.on_output(request.request_id, output)
        except Exception:
            log.exception("on_output of request %s failed; aborting it", request.request_id)
            if not output.finished:
                self.abort(request.request_id)
