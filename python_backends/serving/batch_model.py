"""Base for stateless stage models with dynamic batching (`max_batch_size > 0`, not decoupled).

Triton's Python backend hands `execute` every request of a dynamic batch; each request's tensors keep
their own leading batch dimension. `infer_row` serves one row; a failing request gets an error response
(the OpenAI envelope for a RequestError) without failing the rest of the batch. A request whose client
(or BLS parent, through the side channel) gave up while it was queued is dropped unserved, and one
abandoned while it runs gets its CancelToken set (a watcher thread polls every CANCEL_POLL_S), which
`infer_row` passes to interruptible library calls (an ONNX run ends at once): abandoned work (e.g. the
unspoken sentences of a cancelled chat) never occupies the stage. Each row's time is observed as step
phase "row" (Triton's own nv_inference_queue_duration_us covers the queue).
"""
from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backends.cancel import CancelToken, Interrupted
from omni_backends.errors import RequestError
from omni_backends.serving import model_config, sidechannel
from omni_backends.serving.metrics import StageMetrics


CANCEL_POLL_S = 0.05


class BatchStageModel:
    """Subclass and implement `setup()` and `infer_row(inputs) -> outputs` (numpy arrays without the
    batch dimension); `self.parameters` holds the config.pbtxt parameters as strings and
    `self.cancel_token` the CancelToken of the request being served (pass it to interruptible calls)."""

    def initialize(self, args: dict) -> None:
        self.model_name, self.model_config, self.parameters = model_config.load(args)
        model_config.apply_nice(self.parameters)
        self.input_names = [i["name"] for i in self.model_config["input"]]
        self.metrics = StageMetrics(self.model_name)
        self.cancel_token = CancelToken()
        self._serving: tuple[object, CancelToken] | None = None  # the request being served now
        threading.Thread(target=self._watch, name=f"{self.model_name}-cancel-watch", daemon=True).start()
        self.setup()

    def setup(self) -> None:
        raise NotImplementedError

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _watch(self) -> None:
        """Sets the CancelToken of the request being served once its client or parent gave up."""
        while True:
            time.sleep(CANCEL_POLL_S)
            serving = self._serving
            if serving is not None and not serving[1].is_set() and _abandoned(serving[0]):
                serving[1].set()

    def execute(self, requests):
        return [self._serve(request) for request in requests]

    def _serve(self, request):
        self.metrics.started()
        outcome = "ok"
        try:
            if _abandoned(request):
                outcome = "cancelled"
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.model_name}: request cancelled"))
            tensors = {name: t.as_numpy() for name in self.input_names
                       if (t := pb_utils.get_input_tensor_by_name(request, name)) is not None}
            rows = len(next(iter(tensors.values())))
            results, self.cancel_token = [], CancelToken()
            self._serving = (request, self.cancel_token)
            for row in range(rows):
                started = time.monotonic()
                results.append(self.infer_row({name: array[row] for name, array in tensors.items()}))
                self.metrics.observe("row", time.monotonic() - started)
            outputs = [pb_utils.Tensor(name, _stack([r[name] for r in results])) for name in results[0]]
            return pb_utils.InferenceResponse(outputs)
        except Interrupted:
            outcome = "cancelled"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.model_name}: request cancelled"))
        except RequestError as exc:
            outcome = "rejected" if exc.status < 500 else "error"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(exc.envelope()))
        except Exception as exc:  # noqa: BLE001 - one bad request must not fail the batch
            outcome = "error"
            pb_utils.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.model_name}: {type(exc).__name__}: {exc}"))
        finally:
            self._serving = None
            self.metrics.finished(outcome)


def _abandoned(request) -> bool:
    """The client cancelled the request, or its BLS parent raised its side-channel cancel flag."""
    request_id = request.request_id()
    try:
        gone = sidechannel.stop_requested(request_id, request.is_cancelled)
    except Exception:  # noqa: BLE001 - is_cancelled() is best effort (older backends lack it)
        return False
    if gone:
        sidechannel.clear(request_id)
    return gone


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
