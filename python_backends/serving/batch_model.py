"""Base for stateless stage models with dynamic batching (`max_batch_size > 0`, not decoupled).

Triton's Python backend hands `execute` every request of a dynamic batch; each request's tensors keep
their own leading batch dimension. `infer_row` serves one row; a failing request gets an error response
(the OpenAI envelope for a RequestError) without failing the rest of the batch. A request whose client
(or BLS parent, through the side channel) gave up while it was queued is dropped unserved, and one
abandoned while it runs gets its CancelToken set (a watcher thread polls every CANCEL_POLL_S), which
`infer_row` passes to interruptible library calls (an ONNX run ends at once): abandoned work (e.g. the
unspoken sentences of a cancelled chat) never occupies the stage. Each request is answered as soon as its
own rows are done (through its response sender, before `execute` returns), not when the whole batch is.
Each row's time is observed as step phase "row" (Triton's own nv_inference_queue_duration_us covers the queue).
With `row_workers` > 1 the rows of a batch of two or more rows run that many at a time on worker threads
(for libraries that release the GIL, e.g. CTranslate2); `concurrent` tells `infer_row` it shares the cores.
Every Triton call (tensors, responses, metrics, is_cancelled) stays off the row workers: a row metric sent
from a worker thread crashed tritonserver (SIGSEGV) under concurrent transcriptions.
"""
from __future__ import annotations

import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backends.cancel import CancelToken, Interrupted
from omni_backends.errors import RequestError
from omni_backends.serving import model_config, sidechannel
from omni_backends.serving.metrics import StageMetrics


CANCEL_POLL_S = 0.05


@dataclass(eq=False)
class _Job:
    """One request of a batch: its input tensors, CancelToken, per-row results and the first failure."""

    request: object
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    token: CancelToken = field(default_factory=CancelToken)
    results: list = field(default_factory=list)
    failure: BaseException | None = None
    answered: bool = False


class BatchStageModel:
    """Subclass and implement `setup()` and `infer_row(inputs) -> outputs` (numpy arrays without the
    batch dimension); `self.parameters` holds the config.pbtxt parameters as strings and
    `self.cancel_token` the CancelToken of the request being served (pass it to interruptible calls).
    `setup` may set `self.row_workers` (default 1: rows one after the other on the stub's thread); then
    `self.concurrent` is True in an `infer_row` that runs alongside others."""

    row_workers = 1

    def initialize(self, args: dict) -> None:
        self.model_name, self.model_config, self.parameters = model_config.load(args)
        model_config.apply_nice(self.parameters)
        self.input_names = [i["name"] for i in self.model_config["input"]]
        self.metrics = StageMetrics(self.model_name)
        self._row = threading.local()  # the CancelToken and concurrency of the row this thread serves
        self._live: list[_Job] = []  # the requests of the batch being served
        # Serialises the is_cancelled() round trips to the server and keeps them off requests already answered
        # (one asked of an answered request, or two at once, can leave the stub's messaging waiting forever).
        self._checking = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        threading.Thread(target=self._watch, name=f"{self.model_name}-cancel-watch", daemon=True).start()
        self.setup()

    def setup(self) -> None:
        raise NotImplementedError

    def finalize(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self.metrics.close()

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    @property
    def cancel_token(self) -> CancelToken:
        """The CancelToken of the request whose row this thread serves (a fresh unset one outside a row)."""
        return getattr(self._row, "token", None) or CancelToken()

    @property
    def concurrent(self) -> bool:
        """True while this thread's row runs alongside other rows (row_workers > 1 and a batch of 2+ rows)."""
        return getattr(self._row, "concurrent", False)

    def _watch(self) -> None:
        """Sets the CancelToken of each request being served once its client or parent gave up."""
        while True:
            time.sleep(CANCEL_POLL_S)
            with self._checking:
                for job in self._live:
                    self._check(job)

    def _check(self, job: _Job) -> None:
        """Sets the job's CancelToken if its caller gave up (call with self._checking held)."""
        if not job.token.is_set() and sidechannel.request_abandoned(job.request):
            job.token.set()

    def execute(self, requests):
        """Serves a dynamic batch; each request is answered through its response sender (a non-decoupled model
        may send its one FINAL response before `execute` returns, then returns None) as soon as its own rows
        are done, so a short request batched with a long one does not wait for it."""
        jobs = [self._open(request) for request in requests]
        live = [job for job in jobs if job.failure is None]
        with self._checking:
            self._live = list(live)
        try:
            for job in jobs:
                if job.failure is not None:   # given up while queued, unreadable: answered at once
                    self._answer(job)
            rows = [(job, row) for job in live for row in range(len(job.results))]
            if self.row_workers > 1 and len(rows) > 1:
                self._serve_concurrently(rows)
            else:
                for job in live:
                    for row in range(len(job.results)):
                        self._observe(self._serve_row(job, row, concurrent=False))
                    self._answer(job)
        finally:
            with self._checking:
                self._live = []
            for job in jobs:   # whatever went wrong above, every request gets its one answer
                if not job.answered:
                    self._answer(job)
        return None

    def _serve_concurrently(self, rows: list[tuple[_Job, int]]) -> None:
        """Runs the rows `row_workers` at a time; answers each request (on this, the stub's thread) once its
        last row is done."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.row_workers, thread_name_prefix=f"{self.model_name}-row")
        left = {id(job): len(job.results) for job, _ in rows}
        futures = {self._pool.submit(self._serve_row, job, row, True): job for job, row in rows}
        for future in as_completed(futures):
            job = futures[future]
            self._observe(future.result())
            left[id(job)] -= 1
            if not left[id(job)]:
                self._answer(job)

    def _observe(self, seconds: float | None) -> None:
        if seconds is not None:   # metrics go to the server from the stub's thread only
            self.metrics.observe("row", seconds)

    def _answer(self, job: _Job) -> None:
        """Sends the job's one FINAL response; from now on its request is never asked is_cancelled()."""
        with self._checking:
            self._live = [other for other in self._live if other is not job]
        job.answered = True
        job.request.get_response_sender().send(self._respond(job),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _open(self, request) -> _Job:
        """The job of one request with its tensors read (or its failure: abandoned while queued, unreadable)."""
        self.metrics.started()
        job = _Job(request)
        try:
            with self._checking:
                self._check(job)
            job.token.check()
            job.tensors = {name: t.as_numpy() for name in self.input_names
                           if (t := pb_utils.get_input_tensor_by_name(request, name)) is not None}
            job.results = [None] * len(next(iter(job.tensors.values())))
        except Exception as exc:  # noqa: BLE001 - answered by _respond
            job.failure = exc
        return job

    def _serve_row(self, job: _Job, row: int, concurrent: bool) -> float | None:
        """Runs `infer_row` on one row (no Triton calls: it may run on a worker thread); its seconds, or None
        when it did not run (an earlier row failed, or the request was given up)."""
        if job.failure is not None:  # an earlier row of the request failed: its answer is that error
            return None
        self._row.token, self._row.concurrent = job.token, concurrent
        seconds = None
        try:
            job.token.check()   # given up before this row started: not served, not timed
            started = time.monotonic()
            try:
                job.results[row] = self.infer_row({name: array[row] for name, array in job.tensors.items()})
            finally:
                seconds = time.monotonic() - started
        except Exception as exc:  # noqa: BLE001 - answered by _respond
            job.failure = exc
        finally:
            self._row.token = None
        return seconds

    def _respond(self, job: _Job):
        """The InferenceResponse of a served job: its stacked outputs, or the error of its failure."""
        outcome, exc = "ok", job.failure
        try:
            if exc is None:
                outputs = [pb_utils.Tensor(name, _stack([r[name] for r in job.results])) for name in job.results[0]]
                return pb_utils.InferenceResponse(outputs)
            if isinstance(exc, Interrupted):
                outcome = "cancelled"
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.model_name}: request cancelled"))
            if isinstance(exc, RequestError):
                outcome = "rejected" if exc.status < 500 else "error"
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.envelope()))
            raise exc
        except Exception as failure:  # noqa: BLE001 - one bad request must not fail the batch
            outcome = "error"
            pb_utils.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"{self.model_name}: {type(failure).__name__}: {failure}"))
        finally:
            self.metrics.finished(outcome)


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    """Stack per-row outputs into [rows, ...], zero-padding variable-length 1-D rows (e.g. audio) to the longest."""
    if rows[0].ndim == 1 and len({r.shape for r in rows}) > 1:
        width = max(r.shape[0] for r in rows)
        rows = [np.pad(r, (0, width - r.shape[0])) for r in rows]
    return np.stack(rows)


def string(array: np.ndarray | None, default: str = "") -> str:
    """The first element of a BYTES tensor row as str (default when absent)."""
    if array is None or array.size == 0:
        return default
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)
