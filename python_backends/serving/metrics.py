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
Tests read these to assert that cancelled work really stopped (in-flight back to 0).
"""
from __future__ import annotations

import os
import threading
import time

import triton_python_backend_utils as pb_utils

_OUTCOMES = ("ok", "rejected", "error", "cancelled")
HEARTBEAT_S = 1.0


class StageMetrics:
    """Thread-safe in-flight gauge, outcome counters and heartbeat for one Triton model.
    Every Python model of the repository creates one in `initialize`."""

    def __init__(self, model_name: str):
        inflight = pb_utils.MetricFamily(name="omni_inflight_requests",
                                         description="Requests in flight in an Omni-Triton model",
                                         kind=pb_utils.MetricFamily.GAUGE)
        total = pb_utils.MetricFamily(name="omni_requests_total",
                                      description="Finished requests of an Omni-Triton model by outcome",
                                      kind=pb_utils.MetricFamily.COUNTER)
        heartbeat = pb_utils.MetricFamily(name="omni_model_heartbeat_seconds",
                                          description="Unix time of the model stub's last heartbeat",
                                          kind=pb_utils.MetricFamily.GAUGE)
        tensors = pb_utils.MetricFamily(name="omni_stage_tensors_total",
                                        description="Tensors received or sent by an Omni-Triton model, by memory",
                                        kind=pb_utils.MetricFamily.COUNTER)
        # Families must outlive their metrics: keep references for the model's lifetime.
        self._families = (inflight, total, heartbeat, tensors)
        self._model = model_name
        self._tensor_metrics: dict[tuple[str, str, str], object] = {}
        self._heartbeat = heartbeat.Metric(labels={"model": model_name})
        self._heartbeat.set(time.time())
        threading.Thread(target=self._beat, name=f"{model_name}-heartbeat", daemon=True).start()
        self._inflight = inflight.Metric(labels={"model": model_name})
        self._total = {o: total.Metric(labels={"model": model_name, "outcome": o}) for o in _OUTCOMES}
        self._lock = threading.Lock()
        self._count = 0

    def _beat(self) -> None:
        server = os.getppid()
        while True:
            time.sleep(HEARTBEAT_S)
            if os.getppid() != server:  # tritonserver died (we were re-parented): do not linger as an orphan
                os._exit(1)
            self._heartbeat.set(time.time())

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
                metric = self._families[3].Metric(labels={"model": self._model, "tensor": name,
                                                          "direction": direction, "memory": key[2]})
                self._tensor_metrics[key] = metric
        metric.increment(1)

    def finished(self, outcome: str) -> None:
        with self._lock:
            self._count -= 1
            self._inflight.set(self._count)
            self._total[outcome].increment(1)
