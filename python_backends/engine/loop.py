"""EngineLoop: a background thread that continuously batches all live requests of one runner.

Each iteration: apply pending aborts, admit waiting requests, prefill what the runner takes this
iteration (a runner with chunked prefill may take only part of a long prompt and return no row for
that request yet, so running streams keep decoding between the chunks), apply aborts again, then ONE
decode forward for every prefilled request (the just-prefilled ones included), sample all rows with
one host synchronisation (`sample_rows`, each row with its own params), and call each request's
`on_output`. The thread sleeps on a Condition while nothing is live.

Before each prefill the loop asks every request still waiting for its prefill whether its caller gave
up (`cancelled`), so an abandoned request never costs a prefill. No request value can raise inside the
loop (sampling is total: omni_backends.engine.sampling); if an exception escapes anyway, BatchLoop's
supervisor fails every request in flight with `unavailable=True` (HTTP 503), resets the runner and
restarts the loop on a new thread.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Sequence

import torch

from omni_backends.batch_loop import BatchLoop, LoopUnavailable, asks_to_stop
from omni_backends.engine import sm_split
from omni_backends.engine.request import EngineRequest, FinishReason, IsCancelled, Marks, OnOutput, Prompt, \
    StepOutput
from omni_backends.engine.runner import Runner, RowOutput
from omni_backends.engine.sampling import SamplingParams, sample_rows

log = logging.getLogger(__name__)
EngineUnavailable = LoopUnavailable  # submit() while the loop restarts after a crash (HTTP 503)
# observe(kind, seconds): kind "queue" (submit -> first prefill step of a request), "prefill" or
# "decode" (one forward of the loop, sampling included).
Observer = Callable[[str, float], None]


@dataclass(frozen=True)
class EngineStats:
    """Counters of an EngineLoop.

    Fields:
        in_flight: requests submitted and not yet finished (waiting + running).
        running: requests holding a KV cache in the runner.
        waiting: requests submitted but not yet prefilled.
        steps: forwards run so far (prefill and decode).
        generated_tokens: tokens emitted so far.
        restarts: times the loop crashed and was restarted.
    """

    in_flight: int
    running: int
    waiting: int
    steps: int
    generated_tokens: int
    restarts: int = 0


class EngineLoop(BatchLoop):
    """Owns a runner on a background thread; thread-safe submit/abort (omni_backends.batch_loop).

    Args:
        runner: the model runner (see `omni_backends.engine.runner.Runner`).
        max_running: most requests decoded together; more wait in FIFO order.
        name: thread name.
        stream: CUDA stream the engine thread makes current (its forwards and graph replays run there, so
            engines of other threads of the process can run their kernels concurrently); None: the default.
        partition: the engine thread's SM partition (`sm_split.within`: graphs it captures run on those SMs;
            give a `stream` of the same partition); None: the whole device.
        observe: timing callback (`Observer`; optional, may be set later as the attribute `observe`).
        on_health: see BatchLoop.

    `on_output(request_id, StepOutput)` is called on the engine thread, once per generated token and
    exactly once with `finished=True` per request; keep it fast (hand off to a queue). If it raises,
    that request is aborted. A runner error finishes the affected requests with finish_reason "error".
    """

    def __init__(self, runner: Runner, *, max_running: int = 32, name: str = "engine-loop",
                 stream: torch.cuda.Stream | None = None, observe: Observer | None = None,
                 on_health: Callable[[bool], None] | None = None, partition: sm_split.Partition | None = None) -> None:
        self.runner = runner
        self._steps = 0
        self._tokens = 0
        self.stream, self.partition = stream, partition  # set before the thread starts (BatchLoop.__init__)
        self.observe = observe
        super().__init__(max_running=max_running, name=name, on_health=on_health)

    # ---- public, thread-safe -------------------------------------------------------------------

    def submit(self, request_id: str, prompt: Prompt, params: SamplingParams, on_output: OnOutput,
               cancelled: IsCancelled | None = None, marks: Marks | None = None) -> None:
        """Queue a request; it joins the batch at the next iteration.

        cancelled: optional callable, True once the caller gave up; asked before each prefill step of the
            request, so a request abandoned while it waits never costs a prefill.
        marks: optional `Marks` that gets the request's "prefill_start" and "prefill_end" times.

        Raises:
            ValueError: when request_id is already in flight.
            EngineUnavailable: while the loop restarts after a crash.
            RuntimeError: after shutdown().
        """
        self._enqueue(EngineRequest(request_id, prompt, params, on_output, cancelled, marks))

    def stats(self) -> EngineStats:
        """Current counters (see EngineStats)."""
        with self._cond:
            return EngineStats(
                in_flight=len(self._in_flight),
                running=len(self._running),
                waiting=len(self._waiting),
                steps=self._steps,
                generated_tokens=self._tokens,
                restarts=self.restarts,
            )

    # ---- engine thread -------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext(), \
                sm_split.within(self.partition):
            super()._run()

    def _iterate(self, admitted: list[EngineRequest]) -> None:
        # Prefill every running request whose prompt is not complete yet (the just-admitted ones, and
        # chunked prefills in progress) and whose caller is still there, then one decode step for the
        # prefilled ones.
        self._drop_cancelled([r for r in self._running.values() if not r.prefilled])
        pending = [r for r in self._running.values() if not r.prefilled]
        if pending:
            now = time.monotonic()
            for request in pending:
                if "queued_s" not in request.state:
                    request.state["queued_s"] = now - request.submitted_at
                    self._emit_timing("queue", request.state["queued_s"])
                    if request.marks is not None:
                        request.marks.mark("prefill_start", now)
            self._forward(pending, prefill=True)
        self._apply_aborts()
        decoding = [r for r in self._running.values() if r.prefilled]
        if decoding:
            self._forward(decoding, prefill=False)

    def _forward(self, requests: list[EngineRequest], prefill: bool) -> None:
        """Run one prefill or decode forward for `requests`, then sample and emit per request.

        A prefill may return None for a request whose prompt is not complete yet (chunked prefill).
        """
        started = time.monotonic()
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
        sampled_at = time.monotonic()
        for (request, row), token in zip(done, sampled):
            if prefill and request.marks is not None:
                request.marks.mark("prefill_end", sampled_at)
            request.prefilled = True
            self._emit_token(request, row, token)
        self._emit_timing("prefill" if prefill else "decode", time.monotonic() - started)

    @staticmethod
    def _sample(done: list[tuple[EngineRequest, RowOutput]]) -> list[int]:
        if not done:
            return []
        requests = [r for r, _ in done]
        logits = torch.stack([row.logits for _, row in done])
        seen = [r.seen_token_ids() if r.params.repetition_penalty != 1.0 else None for r in requests]
        generated = [r.output_tensor() if r.params.needs_output_ids else None for r in requests]
        return sample_rows(logits, [r.params for r in requests], seen, [len(r.output_ids) for r in requests],
                           [r.generator for r in requests], generated)

    def _drop_cancelled(self, requests: list[EngineRequest]) -> None:
        """Abort requests whose caller gave up, before any (more) prefill work on them."""
        gone = [r for r in requests if asks_to_stop(r.cancelled)]
        if gone:
            self._finish_all(gone, "abort")

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

    def _fail_unavailable(self, requests: Sequence[EngineRequest], message: str) -> None:
        for request in requests:
            self._call(request, StepOutput(token_id=None, finished=True, finish_reason="error", error=message,
                                           unavailable=True))

    def _reset(self) -> None:
        self.runner.reset()

    def _retire(self, request: EngineRequest) -> None:
        """Free the request's cache (or partial prefill), then drop it from the counters (before its final
        callback). If freeing raises, the request stays in flight, so the crash recovery still finishes it."""
        with self._cond:
            running = request.request_id in self._running
        if running:
            self.runner.release([request.request_id])
        self._release(request)
        request.state.clear()

    def _call(self, request: EngineRequest, output: StepOutput) -> None:
        try:
            request.on_output(request.request_id, output)
        except Exception:
            log.exception("on_output of request %s failed; aborting it", request.request_id)
            if not output.finished:
                self.abort(request.request_id)

    def _emit_timing(self, kind: str, seconds: float) -> None:
        if self.observe is not None:
            try:
                self.observe(kind, seconds)
            except Exception:  # noqa: BLE001 - metrics never fail the engine
                log.exception("engine timing observer failed")

