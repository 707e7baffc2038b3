"""EngineLoop: a background thread that continuously batches all live requests of one runner.

Each iteration: apply pending aborts, admit waiting requests, drop admitted requests whose caller
already gave up (`cancelled()`), run ONE prefill step for the admitted requests (the runner prefills
whole short prompts together and long prompts chunk by chunk, so a long prompt never stalls the
others for more than one chunk), apply aborts again, then ONE decode forward for every running
request (those whose prefill just completed included); sample each row with its own params and call
each request's `on_output`. The thread sleeps on a Condition while nothing is live.

No request value can raise inside the loop (sampling is total, a failing request is finished alone),
and the loop is supervised anyway: if an exception escapes it, every request in flight finishes with
finish_reason "error" and `unavailable=True`, the runner's state is reset and a new thread restarts
the loop after a short backoff (`omni_backends.supervisor`); meanwhile `submit` raises
EngineUnavailable and `healthy` is False.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Sequence

import torch

from omni_backends.engine.request import EngineRequest, FinishReason, IsCancelled, OnOutput, Prompt, StepOutput
from omni_backends.engine.runner import Runner, RowOutput
from omni_backends.engine.sampling import SamplingParams, sample_next_token
from omni_backends.supervisor import Supervisor

log = logging.getLogger(__name__)

# observe(kind, seconds): kind "queue" (submit -> first prefill step of a request), "prefill" or
# "decode" (one forward of the loop, sampling included).
Observer = Callable[[str, float], None]


class EngineUnavailable(RuntimeError):
    """The engine loop crashed and is restarting; the request was not queued (retry later: HTTP 503)."""


@dataclass(frozen=True)
class EngineStats:
    """Counters of an EngineLoop.

    Fields:
        in_flight: requests submitted and not yet finished (waiting + prefilling + running).
        running: requests whose prefill completed (holding a KV cache row).
        waiting: requests submitted but not yet admitted.
        prefilling: admitted requests whose prompt is still being prefilled (chunk by chunk).
        steps: forwards run so far (prefill and decode).
        generated_tokens: tokens emitted so far.
        restarts: times the loop crashed and was restarted.
    """

    in_flight: int
    running: int
    waiting: int
    prefilling: int
    steps: int
    generated_tokens: int
    restarts: int


class EngineLoop:
    """Owns a runner on a supervised background thread; thread-safe submit/abort.

    Args:
        runner: the model runner (see `omni_backends.engine.runner.Runner`).
        max_running: most requests admitted together (prefilling + running); more wait in FIFO order.
        name: thread name.
        on_health: called with False when the loop crashed, True once it runs again (optional).
        observe: timing callback (see `Observer`; optional). Called on the engine thread: keep it fast.

    `on_output(request_id, StepOutput)` is called on the engine thread, once per generated token and
    exactly once with `finished=True` per request; keep it fast (hand off to a queue). If it raises,
    that request is aborted. A runner error finishes the affected requests with finish_reason "error".
    """

    def __init__(self, runner: Runner, *, max_running: int = 32, name: str = "engine-loop",
                 on_health: Callable[[bool], None] | None = None, observe: Observer | None = None) -> None:
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.runner = runner
        self.max_running = max_running
        self.observe = observe  # may be set later (e.g. by the Triton adapter)
        self._cond = threading.Condition()
        self._waiting: deque[EngineRequest] = deque()
        self._prefilling: list[EngineRequest] = []  # engine thread only
        self._running: dict[str, EngineRequest] = {}
        self._aborts: set[str] = set()
        self._in_flight: dict[str, EngineRequest] = {}
        self._stopping = False
        self._steps = 0
        self._tokens = 0
        self._supervisor = Supervisor(name, self._serve, self._crashed, on_health).start()

    # ---- public, thread-safe -------------------------------------------------------------------

    def submit(self, request_id: str, prompt: Prompt, params: SamplingParams, on_output: OnOutput,
               cancelled: IsCancelled | None = None) -> None:
        """Queue a request; it joins the batch at the next iteration.

        cancelled: optional callable, True once the caller gave up; checked before each prefill step
            of the request, so a request abandoned while it waits never costs a prefill.

        Raises:
            ValueError: when request_id is already in flight.
            EngineUnavailable: while the loop restarts after a crash.
            RuntimeError: after shutdown().
        """
        request = EngineRequest(request_id, prompt, params, on_output, cancelled)
        with self._cond:
            if self._stopping:
                raise RuntimeError("EngineLoop is shut down")
            if not self._supervisor.healthy:
                raise EngineUnavailable(f"{self._supervisor.name} is restarting after a failure")
            if request_id in self._in_flight:
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._in_flight[request_id] = request
            self._waiting.append(request)
            self._cond.notify()

    def abort(self, request_id: str) -> bool:
        """Cancel a request before its next step; it gets a final StepOutput with finish_reason "abort".

        Returns:
            True when the request was in flight, False when unknown or already finished.
        """
        with self._cond:
            if request_id not in self._in_flight:
                return False
            self._aborts.add(request_id)
            self._cond.notify()
            return True

    def stats(self) -> EngineStats:
        """Current counters (see EngineStats)."""
        with self._cond:
            return EngineStats(in_flight=len(self._in_flight), running=len(self._running),
                               waiting=len(self._waiting), prefilling=len(self._prefilling), steps=self._steps,
                               generated_tokens=self._tokens, restarts=self._supervisor.restarts)

    @property
    def num_in_flight(self) -> int:
        """Requests submitted and not finished (the metric the Triton adapters export)."""
        with self._cond:
            return len(self._in_flight)

    @property
    def healthy(self) -> bool:
        """False from a crash of the loop until its restarted thread runs."""
        return self._supervisor.healthy

    def shutdown(self, timeout: float | None = None) -> None:
        """Abort every request in flight, stop the thread and join it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._supervisor.join(timeout)

    # ---- engine thread -------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._prefilling or self._running or self._aborts or self._stopping):
                    self._cond.wait()
                if self._stopping:
                    self._aborts.update(self._in_flight)
                else:
                    room = self.max_running - len(self._running) - len(self._prefilling)
                    self._prefilling += [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
            self._apply_aborts()
            if self._stopping:
                return
            self._drop_cancelled()
            if self._prefilling:
                self._prefill_step()
            self._apply_aborts()
            if self._running:
                self._decode_step()

    def _drop_cancelled(self) -> None:
        """Abort admitted requests whose caller gave up, before any (more) prefill work on them."""
        gone = [r for r in self._prefilling if r.cancelled is not None and _asks_to_stop(r.cancelled)]
        if gone:
            self._prefilling = [r for r in self._prefilling if r not in gone]
            self._finish_all(gone, "abort")

    def _prefill_step(self) -> None:
        started = time.monotonic()
        requests = list(self._prefilling)
        for request in requests:
            if "queued_s" not in request.state:
                request.state["queued_s"] = started - request.submitted_at
                self._emit_timing("queue", request.state["queued_s"])
        try:
            rows = self.runner.prefill(requests)
        except Exception as exc:  # a bad prompt or a model error fails these requests, not the engine
            log.exception("runner prefill failed")
            self._prefilling = []
            self._finish_all(requests, "error", repr(exc))
            return
        self._prefilling = [r for r, row in zip(requests, rows) if row is None]
        done = [(r, row) for r, row in zip(requests, rows) if row is not None]
        with self._cond:
            self._steps += 1
            self._running.update((r.request_id, r) for r, _ in done)
        for request, row in done:
            self._emit_token(request, row)
        self._emit_timing("prefill", time.monotonic() - started)

    def _decode_step(self) -> None:
        started = time.monotonic()
        requests = list(self._running.values())
        try:
            tokens = torch.tensor([r.output_ids[-1] for r in requests], dtype=torch.long)
            rows = self.runner.decode(requests, tokens)
        except Exception as exc:  # the engine must survive a model error
            log.exception("runner decode failed")
            self._finish_all(requests, "error", repr(exc))
            return
        with self._cond:
            self._steps += 1
        for request, row in zip(requests, rows):
            self._emit_token(request, row)
        self._emit_timing("decode", time.monotonic() - started)

    def _emit_token(self, request: EngineRequest, row: RowOutput) -> None:
        params = request.params
        with self._cond:
            if request.request_id in self._aborts:
                return  # aborted during the forward: _apply_aborts sends its final output
        try:
            history = request.output_tensor() if params.needs_history else None
            token = sample_next_token(row.logits, params, history, request.prompt.input_ids, request.generator)
        except Exception as exc:  # noqa: BLE001 - fail this request only
            log.exception("sampling failed for request %s", request.request_id)
            self._finish_all([request], "error", f"sampling failed: {exc}")
            return
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

    def _apply_aborts(self) -> None:
        with self._cond:
            aborts, self._aborts = self._aborts, set()
            if not aborts:
                return
            waiting = [r for r in self._waiting if r.request_id in aborts]
            self._waiting = deque(r for r in self._waiting if r.request_id not in aborts)
        prefilling = [r for r in self._prefilling if r.request_id in aborts]
        self._prefilling = [r for r in self._prefilling if r.request_id not in aborts]
        running = [self._running[rid] for rid in aborts if rid in self._running]
        self._finish_all(waiting + prefilling + running, "abort")

    def _finish_all(self, requests: Sequence[EngineRequest], reason: FinishReason, error: str | None = None) -> None:
        for request in requests:
            self._retire(request)
            self._call(request, StepOutput(token_id=None, finished=True, finish_reason=reason, error=error))

    def _retire(self, request: EngineRequest) -> None:
        """Free the request's cache (or partial prefill) and drop it from the counters (before its final callback)."""
        with self._cond:
            self._running.pop(request.request_id, None)
        self.runner.release([request.request_id])
        request.state.clear()
        with self._cond:
            self._in_flight.pop(request.request_id, None)

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

    def _crashed(self, exc: BaseException) -> None:
        """Supervisor recovery: every request in flight fails (retryable), the runner starts empty."""
        with self._cond:
            victims = list(self._in_flight.values())
            self._in_flight.clear()
            self._waiting.clear()
            self._running.clear()
            self._aborts.clear()
            self._prefilling = []
        try:
            self.runner.reset()
        except Exception:  # noqa: BLE001 - the restarted loop will fail again and be reported
            log.exception("runner reset failed")
        message = f"engine failure ({type(exc).__name__}: {exc}); the engine restarts, retry the request"
        for request in victims:
            self._call(request, StepOutput(token_id=None, finished=True, finish_reason="error", error=message,
                                           unavailable=True))


def _asks_to_stop(cancelled: IsCancelled) -> bool:
    try:
        return bool(cancelled())
    except Exception:  # noqa: BLE001 - a failing probe never cancels a request
        return False
