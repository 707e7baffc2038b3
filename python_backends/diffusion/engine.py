"""Step-level continuous batching of denoising jobs (the diffusion analogue of an LLM engine loop).

A `DenoiseJob` is one request in flight: its latents, its own scheduler state and its conditioning rows
(cond, and uncond with true CFG). `DenoiseLoop` runs a thread; each iteration it admits waiting jobs,
applies aborts, groups the live jobs by `bucket` (jobs whose forward inputs can share one batch: same
latent shapes) and calls `Denoiser.step(group)` once per group, which runs ONE transformer forward for
every row of the group and advances each job by one step. Jobs at different steps, with different step
counts, with and without CFG, and with different prompt lengths share a forward. Each job then gets a
`StepOutput` (with its latents when asked for, and always with the last one).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from omni_backends.batch_loop import BatchLoop, asks_to_stop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DenoiseParams:
    """latent_steps: 1-based step numbers after which the job's latents are returned (partial images);
    the latents after the last step are always returned."""

    latent_steps: frozenset[int] = frozenset()


@dataclass
class DenoiseJob:
    """A request's denoising state; families subclass it (latents, scheduler, conditioning tensors).

    bucket: hashable key of what must be equal to share a forward (latent shapes);
    total_steps: the number of steps; step: steps done so far.
    """

    bucket: Hashable
    total_steps: int
    step: int = 0


@dataclass
class StepOutput:
    """One job's output after a step (or its end).

    step / total_steps: steps done / to do; latents: float32, family layout (packed for Qwen-Image),
    set after the steps in `DenoiseParams.latent_steps` and the last; batch_jobs / batch_rows: how many
    jobs / transformer rows shared this step's forward; finished with finish_reason "stop" (all steps
    done), "abort" (cancelled) or "error" (with `error`; `unavailable` when the loop itself failed and
    restarts: retryable, HTTP 503).
    """

    step: int = 0
    total_steps: int = 0
    latents: np.ndarray | None = None
    batch_jobs: int = 0
    batch_rows: int = 0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    unavailable: bool = False


class Denoiser:
    """The family's model side; implement `step(jobs)`, `rows(job)` and `latents(job)`."""

    def step(self, jobs: list[DenoiseJob]) -> None:
        """One transformer forward for all `jobs` (same bucket), then one scheduler step per job."""
        raise NotImplementedError

    def rows(self, job: DenoiseJob) -> int:
        """Transformer rows the job adds to a forward (n images, twice with true CFG)."""
        raise NotImplementedError

    def latents(self, job: DenoiseJob) -> np.ndarray:
        """The job's current latents as float32 numpy."""
        raise NotImplementedError


@dataclass
class _Entry:
    job: DenoiseJob
    params: DenoiseParams
    on_output: Callable[[str, StepOutput], None]
    request_id: str = ""
    cancelled: Callable[[], bool] | None = None


@dataclass
class LoopStats:
    """in_flight: jobs submitted and not finished; running: jobs holding a batch slot; forwards: transformer
    forwards run; steps: job-steps done; max_batch_jobs: the most jobs one forward served."""

    in_flight: int = 0
    running: int = 0
    forwards: int = 0
    steps: int = 0
    max_batch_jobs: int = 0


class DenoiseLoop(BatchLoop):
    """Owns a Denoiser on a background thread; thread-safe `submit` / `abort` / `shutdown` (the EngineLoop
    contract, omni_backends.batch_loop).

    max_running: batch slots (jobs denoised together); more wait in FIFO order.
    `on_output(request_id, StepOutput)` runs on the loop thread once per step and exactly once with
    finished=True; keep it fast. A failing forward finishes the jobs of that group with "error".
    """

    def __init__(self, denoiser: Denoiser, *, max_running: int = 16, name: str = "denoise-loop"):
        self.denoiser = denoiser
        self.observe: Callable[[str, float], None] | None = None  # step timings (set by the Triton adapter)
        self._stats = LoopStats()
        super().__init__(max_running=max_running, name=name)

    def submit(self, request_id: str, job: DenoiseJob, params: DenoiseParams,
               on_output: Callable[[str, StepOutput], None], cancelled: Callable[[], bool] | None = None) -> None:
        """Queue a job; it joins the next iteration. `cancelled` (optional) is asked before each step: a job
        whose caller gave up is aborted instead of stepped. Raises ValueError for an id in flight,
        LoopUnavailable while the loop restarts after a crash, RuntimeError after shutdown()."""
        self._enqueue(_Entry(job, params, on_output, request_id, cancelled))

    def stats(self) -> LoopStats:
        with self._cond:
            return LoopStats(len(self._in_flight), len(self._running), self._stats.forwards, self._stats.steps,
                             self._stats.max_batch_jobs)

    # ---- loop thread ----------------------------------------------------------------------------
    def _iterate(self, admitted: list[_Entry]) -> None:
        gone = [e for e in self._running.values() if asks_to_stop(e.cancelled)]
        if gone:
            self._finish_aborted(gone)
        groups: dict[Hashable, list[_Entry]] = {}
        for entry in list(self._running.values()):
            groups.setdefault(entry.job.bucket, []).append(entry)
        for group in groups.values():
            self._forward(group)

    def _forward(self, group: list[_Entry]) -> None:
        jobs = [e.job for e in group]
        started = time.monotonic()
        try:
            self.denoiser.step(jobs)
        except Exception as exc:  # noqa: BLE001 - the loop must survive a model error
            log.exception("denoiser step failed for %d job(s)", len(jobs))
            for entry in group:
                self._finish(entry, StepOutput(finished=True, finish_reason="error", error=repr(exc)))
            return
        rows = sum(self.denoiser.rows(job) for job in jobs)
        if self.observe is not None:
            self.observe("step", time.monotonic() - started)
        with self._cond:
            self._stats.forwards += 1
            self._stats.steps += len(jobs)
            self._stats.max_batch_jobs = max(self._stats.max_batch_jobs, len(jobs))
        for entry in group:
            job = entry.job
            done = job.step >= job.total_steps
            output = StepOutput(step=job.step, total_steps=job.total_steps, batch_jobs=len(jobs), batch_rows=rows,
                                finished=done, finish_reason="stop" if done else None)
            if done or job.step in entry.params.latent_steps:
                output.latents = self.denoiser.latents(job)
            if done:
                self._finish(entry, output)
            else:
                self._call(entry, output)

    def _finish_aborted(self, entries) -> None:
        for entry in entries:
            self._finish(entry, StepOutput(step=entry.job.step, total_steps=entry.job.total_steps, finished=True,
                                           finish_reason="abort"))

    def _fail_unavailable(self, entries, message: str) -> None:
        for entry in entries:
            self._call(entry, StepOutput(step=entry.job.step, total_steps=entry.job.total_steps, finished=True,
                                         finish_reason="error", error=message, unavailable=True))

    def _finish(self, entry: _Entry, output: StepOutput) -> None:
        self._release(entry)  # the slot is free before the final callback
        self._call(entry, output)

    def _call(self, entry: _Entry, output: StepOutput) -> None:
        try:
            entry.on_output(entry.request_id, output)
        except Exception:  # noqa: BLE001
            log.exception("on_output of %s failed; aborting it", entry.request_id)
            if not output.finished:
                self.abort(entry.request_id)

