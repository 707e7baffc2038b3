"""BLS calls from async decoupled models into other Triton models, streamed and cancellable.

A request is sent with the synchronous `request.exec()` on a sender thread (it returns at the
child's first response) and a decoupled child's *synchronous* response iterator is read on worker
threads, so no request ever blocks the model's event loop or queues behind another. When the
caller's request is cancelled (or the caller stops reading, or its task is cancelled, even while the
child request is being sent) the child is cancelled, and a child's error reaches the caller, through
`omni_backends.serving.sidechannel` (Triton 2.51 can do neither through BLS). The caller's
cancellation is checked before anything is sent, so an orchestrator never starts a child for a
client that has gone.
"""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import AsyncIterator, Awaitable

import triton_python_backend_utils as pb_utils

from omni_backends.errors import RequestError
from omni_backends.serving import retire, sidechannel
from omni_backends.serving.decoupled import Cancelled, RequestContext
from omni_backends.serving.tensors import from_triton, to_triton


_DONE = object()
_ABANDONED = object()
CANCEL_POLL_S = 0.05
# Each streamed child holds a worker thread while it waits for its next response, and each send holds
# one until the child answers; the event loop's default pool (cores + 4 threads) would queue
# concurrent requests behind each other. Reads and sends get their own pools.
_WORKERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="bls")
_SENDERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="bls-send")


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


async def stream(ctx: RequestContext | None, model: str, inputs: dict, outputs: list[str],
                 **kwargs) -> AsyncIterator[dict]:
    """Streams a decoupled model's responses as {output name: array} (empty FINAL responses skipped).

    Inputs and outputs are numpy arrays or, in GPU memory, CUDA torch tensors (`serving.tensors`).

    ctx: the caller's request (its cancellation cancels the child); None for a child that must run
    to its end (e.g. the clean-up of a cancelled turn).
    kwargs go to pb_utils.InferenceRequest (e.g. correlation_id=, flags= for sequence batching).
    Raises RequestError (client's fault, envelope passed through), StageError, or Cancelled.
    Leaving early (an exception, or the consumer closing this generator) cancels the child request.
    """
    if ctx is not None:
        ctx.check()
    loop = asyncio.get_running_loop()
    child_id = sidechannel.child_request_id()
    child = _Child(await _send(ctx, _request(model, inputs, outputs, request_id=child_id, **kwargs), child_id,
                               decoupled=True))
    finished = False
    try:
        while True:
            pending = loop.run_in_executor(_WORKERS, child.read)
            while not pending.done():
                # Poll the client's cancellation while the child is still working.
                await asyncio.wait({pending}, timeout=CANCEL_POLL_S)
                if ctx is not None and ctx.cancelled():
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
        if finished:
            child.release()
        else:  # cancelled, failed, or the consumer stopped early: stop the child too
            sidechannel.request_cancel(child_id)
            _WORKERS.submit(_drain, child, child_id)


class _Child:
    """A decoupled child's response iterator, read by one worker thread at a time (a read may still be
    pending when the caller leaves). `release()` lets go of the iterator as soon as the stream is done
    (one kept alive, e.g. by a traceback in a reference cycle until the garbage collector ran, left the
    caller's model impossible to unload), through `retire.park`: dropping it at once could leave its
    last reference to a stub thread that frees Python objects without the GIL (see `retire`)."""

    def __init__(self, iterator):
        self._iterator, self._lock = iterator, threading.Lock()

    def read(self):
        with self._lock:
            return _DONE if self._iterator is None else next(self._iterator, _DONE)

    def release(self) -> None:
        with self._lock:
            iterator, self._iterator = self._iterator, None
        if iterator is not None:
            retire.park(iterator)


def _drain(child: _Child, child_id: str) -> None:
    """Reads a cancelled child's stream to its FINAL, then releases it and removes its side-channel files."""
    try:
        while child.read() is not _DONE:
            pass
    finally:
        child.release()
        sidechannel.clear(child_id)
        sidechannel.take_error(child_id)


async def _send(ctx: RequestContext | None, request, child_id: str, decoupled: bool = False):
    """`request.exec(...)` on a sender thread (it returns once the child answered: its first response,
    or its only one), polling the caller's cancellation meanwhile.

    Triton's own `async_exec` runs on the event loop's default executor (cores + 4 threads), so
    concurrent requests queued behind each other and a request whose client had already gone was
    still sent later. Here a send that has not started when the caller gives up is never made; one
    already on its way is told to stop through the side channel, and its late result is drained.
    Raises Cancelled (or CancelledError when the calling task is cancelled)."""
    abandoned = threading.Event()

    def send():
        return _ABANDONED if abandoned.is_set() else request.exec(decoupled=decoupled)

    sending = asyncio.get_running_loop().run_in_executor(_SENDERS, send)
    try:
        while True:
            done, _ = await asyncio.wait({sending}, timeout=CANCEL_POLL_S)
            if done:
                return sending.result()
            if ctx is not None and ctx.cancelled():
                raise Cancelled()
    except (asyncio.CancelledError, Cancelled):
        abandoned.set()
        sidechannel.request_cancel(child_id)
        sending.add_done_callback(lambda late: _abandon(late, child_id, decoupled))
        raise


def _abandon(late: asyncio.Future, child_id: str, decoupled: bool) -> None:
    """Cleans up after a send its caller gave up on: drains a late response stream, removes flags."""
    result = None if late.cancelled() or late.exception() is not None else late.result()
    if result is None or result is _ABANDONED or not decoupled:
        sidechannel.clear(child_id)
        sidechannel.take_error(child_id)
        return
    _WORKERS.submit(_drain, _Child(result), child_id)


async def infer(ctx: RequestContext | None, model: str, inputs: dict, outputs: list[str], **kwargs) -> dict:
    """One non-decoupled inference (e.g. a dynamically batched stateless stage).

    ctx: the caller's request, checked before sending and while waiting (None: never cancelled). If
    the caller gives up while the child is queued or running, the child is told to stop through the
    side channel (batch stages then drop it: `BatchStageModel`). Raises like `stream`.
    """
    if ctx is not None:
        ctx.check()
    child_id = sidechannel.child_request_id()
    response = await _send(ctx, _request(model, inputs, outputs, request_id=child_id, **kwargs), child_id)
    sidechannel.clear(child_id)
    _raise_for(model, response)
    return _outputs(response, outputs)


async def gather(*calls: Awaitable) -> list:
    """Awaits BLS calls (`infer`, ...) of one request concurrently and returns their results in order, like
    `asyncio.gather`, except that the first failure first cancels the calls still running (their children
    are told to stop) and waits for them: no call outlives the handler that made it. With asyncio.gather
    they ran on after the handler had raised and the request was answered, for nobody."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
