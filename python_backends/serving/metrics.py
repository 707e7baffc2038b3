"""Per-model custom metrics on Triton's metrics port (next to nv_inference_*).

omni_inflight_requests{model}            gauge: requests currently being served by the model
omni_requests_total{model, outcome}      counter: finished requests by outcome
                                         (ok | rejected | error | cancelled)
omni_stage_tensors_total{model, tensor, direction, memory}
                                         counter: tensors a model received (in) or sent (out)
                                         by memory (gpu | cpu), for the tensors a stage reports
                                         (the thinker -> talker hidden states: DLPack on GPU)
omni_model_heartbeat_seconds{model}      gauge: unix time of the stub's last heartbeat (every
                                         HEARTBEAT_S); a dead stub leaves it stale, which the
                                         frontend's /health reports (Triton's own readiness stays
                                         READY when a stub dies: server issue #8604). The same thread
                                         ends the stub if its tritonserver died.
omni_model_healthy{model}                gauge: 1 while the model's worker loops run; 0 from a crash of
                                         one (e.g. an engine loop) until its restart (/health: 503)
omni_worker_restarts_total{model}        counter: worker loops restarted after a crash
omni_stage_queue_seconds{model}          histogram: time a request waited inside the stage before its
                                         work started (engine: submit -> first prefill step; talker:
                                         request -> its sequence's next step)
omni_stage_step_seconds{model, phase}    histogram: duration of one step of the stage's worker, by phase
                                         (engine: prefill | decode; talker: step; code2wav: decode;
                                         batch stages: row)
omni_first_audio_phase_seconds{model, phase}
                                         histogram: each phase of a request's path to its first audio
                                         packet, and phase="total" (= TTFP inside the model); reported by
                                         the co-located Qwen3-Omni model (qwen3_omni.first_audio)
Tests read these to assert that cancelled work really stopped (in-flight back to 0).

Crash and hang traces: creating a StageMetrics enables `faulthandler` in the stub (a fatal signal writes
every thread's Python stack to stderr, i.e. the server log), and the heartbeat re-arms a faulthandler
watchdog each beat: a stub whose heartbeat stalls for STALL_DUMP_S (the frontend reloads it after 30 s)
writes every thread's stack to the log first, so the log shows where it hung.
"""
from __future__ import annotations

import faulthandler
import gc
import os
import threading
import time

import triton_python_backend_utils as pb_utils

_OUTCOMES = ("ok", "rejected", "error", "cancelled")
HEARTBEAT_S = 1.0
STALL_DUMP_S = 20.0
# seconds; covers a 1 ms decode step to a 30 s prefill
BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
# seconds; first-audio phases run from ~50 us (a thread hand-off) to a prefill
PHASE_BUCKETS = [0.0001, 0.00025, 0.0005, *BUCKETS[:-1]]


def _family(name: str, description: str, kind):
    return pb_utils.MetricFamily(name=name, description=description, kind=kind)


class StageMetrics:
    """Thread-safe in-flight gauge, outcome counters, health, timing histograms and heartbeat for one
    Triton model. Every Python model of the repository creates one in `initialize`."""

    def __init__(self, model_name: str):
        gauge, counter, histogram = (pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER,
                                     pb_utils.MetricFamily.HISTOGRAM)
        inflight = _family("omni_inflight_requests", "Requests in flight in an Omni-Triton model", gauge)
        total = _family("omni_requests_total", "Finished requests of an Omni-Triton model by outcome", counter)
        heartbeat = _family("omni_model_heartbeat_seconds", "Unix time of the model stub's last heartbeat", gauge)
        healthy = _family("omni_model_healthy", "1 while the model's worker loops run, 0 while one restarts", gauge)
        restarts = _family("omni_worker_restarts_total", "Worker loops of the model restarted after a crash", counter)
        self._queue_family = _family("omni_stage_queue_seconds",
                                     "Seconds a request waited inside the stage before its work started", histogram)
        self._step_family = _family("omni_stage_step_seconds", "Seconds per step of the stage's worker, by phase",
                                    histogram)
        self._tensor_family = _family("omni_stage_tensors_total",
                                      "Tensors received or sent by an Omni-Triton model, by memory", counter)
        self._first_audio_family = _family("omni_first_audio_phase_seconds",
                                           "Seconds of each phase of a request's path to its first audio packet",
                                           histogram)
        # Families must outlive their metrics: keep references for the model's lifetime.
        self._families = (inflight, total, heartbeat, healthy, restarts, self._queue_family, self._step_family,
                          self._tensor_family, self._first_audio_family)
        self.model_name = model_name
        labels = {"model": model_name}
        self._heartbeat = heartbeat.Metric(labels=labels)
        self._heartbeat.set(time.time())
        self._healthy = healthy.Metric(labels=labels)
        self._healthy.set(1)
        self._restarts = restarts.Metric(labels=labels)
        self._queue = self._queue_family.Metric(labels=labels, buckets=BUCKETS)
        self._steps: dict[str, object] = {}
        self._first_audio: dict[str, object] = {}
        self._tensor_metrics: dict[tuple[str, str, str], object] = {}
        faulthandler.enable(all_threads=True)
        self._stop = threading.Event()
        self._beating = threading.Thread(target=self._beat, name=f"{model_name}-heartbeat", daemon=True)
        self._beating.start()
        self._inflight = inflight.Metric(labels=labels)
        self._inflight.set(0)  # a restarted stub starts from 0, whatever its dead predecessor left
        self._total = {o: total.Metric(labels={**labels, "outcome": o}) for o in _OUTCOMES}
        self._lock = threading.Lock()
        self._count = 0

    def _beat(self) -> None:
        server = os.getppid()
        while not self._stop.wait(HEARTBEAT_S):
            if os.getppid() != server:  # tritonserver died (we were re-parented): do not linger as an orphan
                os._exit(1)
            self._heartbeat.set(time.time())
            faulthandler.dump_traceback_later(STALL_DUMP_S)   # replaces the previous beat's watchdog

    def close(self) -> None:
        """Stop the heartbeat and its stall watchdog and free the metrics and their families (metrics first);
        every model calls this from `finalize`, and nothing may be recorded after it. After `finalize` the
        stub tears down the shared memory that metrics live in: a beat written then, or a family freed only
        when the interpreter exits, killed the stub with SIGSEGV at server shutdown ("Fatal Python error" in
        the server log; the family's destructor writes to that memory). For the same reason it collects the
        process's cyclic garbage last: requests kept in reference cycles (e.g. by a failed row's traceback) were
        freed by the interpreter's exit-time collection, and their destructors crashed the stub the same way."""
        self._stop.set()
        self._beating.join(timeout=2 * HEARTBEAT_S)
        faulthandler.cancel_dump_traceback_later()
        with self._lock:
            self._total, self._steps, self._first_audio, self._tensor_metrics = {}, {}, {}, {}
            self._heartbeat = self._healthy = self._restarts = self._queue = self._inflight = None
            self._queue_family = self._step_family = self._tensor_family = self._first_audio_family = None
            self._families = ()
        gc.collect()

    @property
    def inflight(self) -> int:
        return self._count

    def started(self) -> None:
        with self._lock:
            self._count += 1
            self._inflight.set(self._count)

    def tensor(self, name: str, direction: str, gpu: bool) -> None:
        """Count one tensor `name` received ("in") or sent ("out") in GPU or CPU memory."""
        key = (name, direction, "gpu" if gpu else "cpu")
        with self._lock:
            metric = self._tensor_metrics.get(key)
            if metric is None:
                metric = self._tensor_family.Metric(labels={"model": self.model_name, "tensor": name,
                                                            "direction": direction, "memory": key[2]})
                self._tensor_metrics[key] = metric
        metric.increment(1)

    def finished(self, outcome: str) -> None:
        with self._lock:
            self._count -= 1
            self._inflight.set(self._count)
            self._total[outcome].increment(1)

    def set_healthy(self, healthy: bool) -> None:
        """Report a worker loop crash (False; counts a restart) or its recovery (True)."""
        self._healthy.set(1 if healthy else 0)
        if not healthy:
            self._restarts.increment(1)

    def observe(self, kind: str, seconds: float) -> None:
        """kind "queue": a request's wait inside the stage; any other kind: one worker step of that phase."""
        if kind == "queue":
            self._queue.observe(seconds)
            return
        self._phase_metric(self._steps, self._step_family, kind, BUCKETS).observe(seconds)

    def first_audio(self, phases: dict[str, float]) -> None:
        """One request's first-audio phases ({phase: seconds}, `FirstAudioTimeline.phases`) and their total."""
        for phase, seconds in {**phases, "total": sum(phases.values())}.items():
            self._phase_metric(self._first_audio, self._first_audio_family, phase, PHASE_BUCKETS).observe(seconds)

    def _phase_metric(self, metrics: dict, family, phase: str, buckets: list[float]):
        """The histogram of `family` labelled with this model and `phase`, created on first use."""
        with self._lock:
            metric = metrics.get(phase)
            if metric is None:
                metric = metrics[phase] = family.Metric(labels={"model": self.model_name, "phase": phase},
                                                        buckets=buckets)
        return metric
