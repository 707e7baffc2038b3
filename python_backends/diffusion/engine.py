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
import threading
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

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
    done), "abort" (cancelled) or "error" (with `error`).
    """

    step: int = 0
    total_steps: int = 0
    latents: np.ndarray | None = None
    batch_jobs: int = 0
    batch_rows: int = 0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


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


@dataclass
class LoopStats:
    """in_flight: jobs submitted and not finished; running: jobs holding a batch slot; forwards: transformer
    forwards run; steps: job-steps done; max_batch_jobs: the most jobs one forward served."""

    in_flight: int = 0
    running: int = 0
    forwards: int = 0
    steps: int = 0
    max_batch_jobs: int = 0


class DenoiseLoop:
    """Owns a Denoiser on a background thread; thread-safe `submit` / `abort` (the EngineLoop contract).

    max_running: batch slots (jobs denoised together); more wait in FIFO order.
    `on_output(request_id, StepOutput)` runs on the loop thread once per step and exactly once with
    finished=True; keep it fast. A failing forward finishes the jobs of that group with "error".
    """

    def __init__(self, denoiser: Denoiser, *, max_running: int = 16, name: str = "denoise-loop"):
        if max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {max_running}")
        self.denoiser, self.max_running = denoiser, max_running
        self._cond = threading.Condition()
        self._waiting: deque[_Entry] = deque()
        self._running: dict[str, _Entry] = {}
        self._aborts: set[str] = set()
        self._stopping = False
        self._stats = LoopStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, request_id: str, job: DenoiseJob, params: DenoiseParams,
               on_output: Callable[[str, StepOutput], None]) -> None:
        """Queue a job; it joins the next iteration. Raises ValueError for a duplicate id, RuntimeError
        after shutdown()."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("DenoiseLoop is shut down")
            if request_id in self._running or any(e.request_id == request_id for e in self._waiting):
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._waiting.append(_Entry(job, params, on_output, request_id))
            self._cond.notify()

    def abort(self, request_id: str) -> bool:
        """Cancel a job before its next step (final output with finish_reason "abort"); False if unknown."""
        with self._cond:
            if request_id not in self._running and all(e.request_id != request_id for e in self._waiting):
                return False
            self._aborts.add(request_id)
            self._cond.notify()
            return True

    def stats(self) -> LoopStats:
        with self._cond:
            return LoopStats(len(self._running) + len(self._waiting), len(self._running), self._stats.forwards,
                             self._stats.steps, self._stats.max_batch_jobs)

    def shutdown(self, timeout: float | None = None) -> None:
        """Abort every job, stop the thread and join it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # ---- loop thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._running or self._aborts or self._stopping):
                    self._cond.wait()
                if self._stopping:
                    self._aborts.update(self._running)
                    self._aborts.update(e.request_id for e in self._waiting)
                while self._waiting and len(self._running) < self.max_running and not self._stopping:
                    entry = self._waiting.popleft()
                    self._running[entry.request_id] = entry
            self._apply_aborts()
            if self._stopping:
                return
            groups: dict[Hashable, list[_Entry]] = {}
            for entry in list(self._running.values()):
                groups.setdefault(entry.job.bucket, []).append(entry)
            for group in groups.values():
                self._forward(group)

    def _forward(self, group: list[_Entry]) -> None:
        jobs = [e.job for e in group]
        try:
            self.denoiser.step(jobs)
        except Exception as exc:  # noqa: BLE001 - the loop must survive a model error
            log.exception("denoiser step failed for %d job(s)", len(jobs))
            for entry in group:
                self._finish(entry, StepOutput(finished=True, finish_reason="error", error=repr(exc)))
            return
        rows = sum(self.denoiser.rows(job) for job in jobs)
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

    def _apply_aborts(self) -> None:
        with self._cond:
            aborts, self._aborts = self._aborts, set()
            entries = [self._running[r] for r in aborts if r in self._running]
            entries += [e for e in self._waiting if e.request_id in aborts]
            self._waiting = deque(e for e in self._waiting if e.request_id not in aborts)
        for entry in entries:
            self._finish(entry, StepOutput(step=entry.job.step, total_steps=entry.job.total_steps, finished=True,
                                           finish_reason="abort"))

    def _finish(self, entry: _Entry, output: StepOutput) -> None:
        with self._cond:
            self._running.pop(entry.request_id, None)  # the slot is free before the final callback
        self._call(entry, output)

    def _call(self, entry: _Entry, output: StepOutput) -> None:
        try:
            entry.on_output(entry.request_id, output)
        except Exception:  # noqa: BLE001
            log.exception("on_output of %s failed; aborting it", entry.request_id)
            if not output.finished:
                self.abort(entry.request_id)
