"""BLS calls from async decoupled models into other Triton models, streamed and cancellable.

`await request.async_exec(decoupled=True)` hands back a *synchronous* iterator; iterating it on
the event loop would block every other request of the model, so each `next()` runs in a worker
thread. When the caller's request is cancelled (or the caller stops reading) the child is
cancelled, and a child's error reaches the caller, through `omni_backends.serving.sidechannel`
(Triton 2.51 can do neither through BLS).
"""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import AsyncIterator

import triton_python_backend_utils as pb_utils

from omni_backends.errors import RequestError
from omni_backends.serving import sidechannel
from omni_backends.serving.decoupled import Cancelled, RequestContext
from omni_backends.serving.tensors import from_triton, to_triton

_DONE = object()
CANCEL_POLL_S = 0.05
# Each streamed child holds a worker thread while it waits for its next response; the event loop's
# default pool (cores + 4 threads) would queue concurrent streams behind each other.
_WORKERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="bls")


class StageError(RuntimeError):
    """A child model answered with an error response."""


def _request(model: str, inputs: dict, outputs: list[str], **kwargs):
    return pb_utils.InferenceRequest(model_name=model, inputs=[to_triton(k, v) for k, v in inputs.items()],
                                     requested_output_names=outputs, **kwargs)


def _raise_for(model: str, response) -> None:
    if response.has_error():
        _raise_message(model, response.error().message())


def _raise_message(model: str, message: str) -> None:
    """RequestError for an OpenAI envelope (the client's fault, passed through), else StageError."""
    if message.lstrip().startswith('{"error"'):
        err = json.loads(message)["error"]
        raise RequestError(err["message"], param=err.get("param"), code=err.get("code"),
                           status=int(err.get("status", 400)))
    raise StageError(f"{model}: {message}")


def _outputs(response, names: list[str]) -> dict:
    """Output name -> numpy array (CPU) or CUDA torch tensor (GPU, zero-copy)."""
    found = {}
    for name in names:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        if tensor is not None:
            found[name] = from_triton(tensor)
    return found


async def stream(ctx: RequestContext, model: str, inputs: dict, outputs: list[str],
                 **kwargs) -> AsyncIterator[dict]:
    """Streams a decoupled model's responses as {output name: array} (empty FINAL responses skipped).

    Inputs and outputs are numpy arrays or, in GPU memory, CUDA torch tensors (`serving.tensors`).

    kwargs go to pb_utils.InferenceRequest (e.g. correlation_id=, flags= for sequence batching).
    Raises RequestError (client's fault, envelope passed through), StageError, or Cancelled.
    Leaving early (an exception, or the consumer closing this generator) cancels the child request.
    """
    loop = asyncio.get_running_loop()
    child_id = sidechannel.child_request_id()
    iterator = await _request(model, inputs, outputs, request_id=child_id, **kwargs).async_exec(decoupled=True)
    reading = threading.Lock()  # one reader at a time: a read may still be pending when we leave

    def read():
        with reading:
            return next(iterator, _DONE)

    finished = False
    try:
        while True:
            pending = loop.run_in_executor(_WORKERS, read)
            while not pending.done():
                # Poll the client's cancellation while the child is still working.
                await asyncio.wait({pending}, timeout=CANCEL_POLL_S)
                if ctx.cancelled():
                    raise Cancelled()
            response = pending.result()
            if response is _DONE:
                finished = True
                error = sidechannel.take_error(child_id)
                if error is not None:
                    _raise_message(model, error)
                return
            if response.has_error():  # the child sends FINAL right after its error: nothing to cancel
                finished = True
                sidechannel.take_error(child_id)
                _raise_for(model, response)
            tensors = _outputs(response, outputs)
            if tensors:
                yield tensors
    finally:
        if not finished:  # cancelled, failed, or the consumer stopped early: stop the child too
            sidechannel.request_cancel(child_id)
            _WORKERS.submit(_drain, read, child_id)


def _drain(read, child_id: str) -> None:
    """Reads a cancelled child's stream to its FINAL, then removes its side-channel files."""
    try:
        while read() is not _DONE:
            pass
    finally:
        sidechannel.clear(child_id)
        sidechannel.take_error(child_id)


async def infer(model: str, inputs: dict, outputs: list[str], **kwargs) -> dict:
    """One non-decoupled inference (e.g. a dynamically batched stateless stage)."""
    response = await _request(model, inputs, outputs, **kwargs).async_exec()
    _raise_for(model, response)
    return _outputs(response, outputs)
