"""EngineLoop: a background thread that continuously batches all live requests of one runner.

Each iteration: apply pending aborts, admit waiting requests, prefill what the runner takes this
iteration (a runner with chunked prefill may take only part of a long prompt and return no row for
that request yet, so running streams keep decoding between the chunks), apply aborts again, then ONE
decode forward for every prefilled request (the just-prefilled ones included), sample all rows with
one host synchronisation (`sample_rows`, each row with its own params), and call each request's
`on_output`. The thread sleeps on a Condition while nothing is live.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from omni_backends.batch_loop import BatchLoop
from omni_backends.engine.request import EngineRequest, FinishReason, OnOutput, Prompt, StepOutput
from omni_backends.engine.runner import Runner, RowOutput
from omni_backends.engine.sampling import SamplingParams, sample_rows

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
        stream: CUDA stream the engine thread makes current (its forwards and graph replays run there, so
            engines of other threads of the process can run their kernels concurrently); None: the default.

    `on_output(request_id, StepOutput)` is called on the engine thread, once per generated token and
    exactly once with `finished=True` per request; keep it fast (hand off to a queue). If it raises,
    that request is aborted. A runner error finishes the affected requests with finish_reason "error".
    """

    def __init__(self, runner: Runner, *, max_running: int = 32, name: str = "engine-loop",
                 stream: torch.cuda.Stream | None = None) -> None:
        self.runner = runner
        self._steps = 0
        self._tokens = 0
        self.stream = stream  # set before the thread starts (BatchLoop.__init__)
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

    def _run(self) -> None:
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            super()._run()

    def _iterate(self, admitted: list[EngineRequest]) -> None:
        # Prefill every running request whose prompt is not complete yet (the just-admitted ones, and
        # chunked prefills in progress), then one decode step for the prefilled ones.
        pending = [r for r in self._running.values() if not r.prefilled]
        if pending:
            self._forward(pending, prefill=True)
        self._apply_aborts()
        decoding = [r for r in self._running.values() if r.prefilled]
        if decoding:
            self._forward(decoding, prefill=False)

    def _forward(self, requests: list[EngineRequest], prefill: bool) -> None:
        """Run one prefill or decode forward for `requests`, then sample and emit per request.

        A prefill may return None for a request whose prompt is not complete yet (chunked prefill).
        """
        try:
            if prefill:
                rows = self.runner.prefill(requests)
            else:
                tokens = torch.tensor([r.output_ids[-1] for r in requests], dtype=torch.long)
                rows = self.runner.decode(requests, tokens)
            done = [(r, row) for r, row in zip(requests, rows) if row is not None]
            sampled = self._sample(done)
        except Exception as exc:  # the engine must survive a bad request or model error
            log.exception("runner %s failed", "prefill" if prefill else "decode")
            self._finish_all(requests if prefill else list(self._running.values()), "error", repr(exc))
            return
        with self._cond:
            self._steps += 1
        for (request, row), token in zip(done, sampled):
            request.prefilled = True
            self._emit_token(request, row, token)

    @staticmethod
    def _sample(done: list[tuple[EngineRequest, RowOutput]]) -> list[int]:
        if not done:
            return []
        requests = [r for r, _ in done]
        logits = torch.stack([row.logits for _, row in done])
        seen = [r.seen_token_ids() if r.params.repetition_penalty != 1.0 else None for r in requests]
        return sample_rows(logits, [r.params for r in requests], seen, [len(r.output_ids) for r in requests],
                           [r.generator for r in requests])

    def _emit_token(self, request: EngineRequest, row: RowOutput, token: int) -> None:
        params = request.params
        with self._cond:
            if request.request_id in self._aborts:
                return  # aborted during the forward: _apply_aborts sends its final output
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
