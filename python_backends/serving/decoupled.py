"""Base class for decoupled Python-backend models that serve each request with one coroutine
(client-facing BLS orchestrators, and test models of the framework).

`async def execute` starts one coroutine per request and returns; each coroutine streams the
events of `handle()` as responses, then always sends FINAL — also after an error (Triton sends
no FINAL when a decoupled execute raises, and the client would wait forever) and after
cancellation (the client cancelled its gRPC stream, or a BLS parent raised the cancel flag of
omni_backends.serving.sidechannel; `ctx.cancelled()` turns True).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backends.errors import RequestError
from omni_backends.serving import events, model_config, outbox, retire, sidechannel
from omni_backends.serving.metrics import StageMetrics


CANCEL_POLL_S = 0.05


class Cancelled(Exception):
    """Raised inside a request coroutine when the client cancelled the request."""


def send_response(sender, request_id: str, response) -> bool:
    """Sends one response; a BLS child's goes through this process's outbox (`serving.outbox`: a send
    to a parent whose stub died never returns in Triton 2.51, and it must not stop the caller's loop).
    Returns False, sending nothing, when the child's parent is known to be gone (the poll of
    `sidechannel.owner_gone`; the outbox looks again right before it sends)."""
    if not sidechannel.is_child(request_id):
        sender.send(response)
        return True
    if sidechannel.owner_gone(request_id):
        return False
    outbox.put(request_id, lambda: sender.send(response))
    return True


def send_final(sender, request_id: str, error: str | None = None) -> None:
    """Ends a decoupled request: FINAL, on the error response when there is an error.

    A BLS parent cannot see a child's error through Triton 2.51, so a BLS child's error travels on the
    side channel only: an error response to a BLS parent arrives empty, and it also leaves the
    parent's BLS request unfinished for Triton, so that the parent model could never be unloaded
    (its unload waits for the request for good). A BLS child's FINAL goes through the outbox like its
    responses; none is sent to a parent whose process is gone, so that request stays open inside
    Triton (its model's unload waits for it)."""
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if sidechannel.is_child(request_id):
        if error is not None:
            sidechannel.report_error(request_id, error)
        outbox.put(request_id, lambda: sender.send(flags=final))
    elif error is not None and not sender.is_cancelled():
        # One response carrying both the error and FINAL: two sends in a row could race in the backend.
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), flags=final)
    else:
        sender.send(flags=final)


class RequestContext:
    """What a request coroutine may use: its parsed REQUEST body, raw input tensors, the request
    id and correlation id, and `cancelled()` (poll it in long loops; `check()` raises Cancelled)."""

    def __init__(self, request, sender):
        self.request, self._sender = request, sender
        self.request_id = request.request_id()
        self.correlation_id = request.correlation_id()
        self._cancelled = False
        self._checked = 0.0
        self._finished = False

    def input(self, name: str) -> np.ndarray | None:
        """Input tensor `name` as numpy, or None if the client did not send it."""
        tensor = pb_utils.get_input_tensor_by_name(self.request, name)
        return None if tensor is None else tensor.as_numpy()

    def body(self) -> dict:
        """The REQUEST JSON object; raises RequestError if missing or malformed."""
        raw = self.input(events.REQUEST)
        if raw is None:
            raise RequestError("missing input tensor REQUEST")
        return events.decode_request(raw)

    def cancelled(self) -> bool:
        """The client cancelled (gRPC) or the BLS parent asked this request to stop. Asked at most once
        per CANCEL_POLL_S however many tasks of the request poll it (each `is_cancelled()` is a round
        trip through one server thread shared by all requests of the model); each time, the BLS
        response iterators finished before are dropped (`retire.checkpoint`). True for good once the
        request was answered (`finish`): its response factory is gone, and asking it `is_cancelled()`
        then crashed tritonserver (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled), so a task
        of the request still running after its FINAL stops at its next poll instead."""
        if self._finished:
            return True
        if not self._cancelled and time.monotonic() - self._checked >= CANCEL_POLL_S:
            self._checked = time.monotonic()
            self._cancelled = sidechannel.stop_requested(
                self.request_id, lambda: retire.checkpoint(self._sender.is_cancelled))
        return self._cancelled

    def check(self) -> None:
        if self.cancelled():
            raise Cancelled()

    def finish(self) -> None:
        """Marks the request answered (call right before its FINAL): from now on `cancelled()` is True
        without asking Triton."""
        self._finished = True


class AsyncDecoupledModel:
    """Subclass and implement `handle(ctx)`: an async generator of `(event_dict, audio_or_None)` (or another
    payload that an overridden `encode` turns into tensors).

    Optional hooks: `setup(args)` (after the model config is parsed) and `teardown()`.
    `request_fields` (the REQUEST keys `handle` reads; `field_hints`: advice for fields it refuses) makes the
    model answer REQUEST {"action": "fields"} with `events.fields_event` instead of calling `handle`, and refuse
    any other REQUEST holding a non-null key outside them before `handle` runs (`events.require_known_fields`:
    400 `unsupported_parameter`), so `handle` reads only known fields and need not check them itself; a
    REQUEST whose "action" is one of `control_actions` (those `handle` answers itself, e.g. "voices") is passed
    to `handle` unchecked.
    Exposes per-model metrics (in-flight requests, requests by outcome) on Triton's metrics port.
    """

    request_fields: tuple[str, ...] | None = None
    field_hints: dict[str, str] = {}
    control_actions: tuple[str, ...] = ()

    def initialize(self, args: dict) -> None:
        self.model_name, self.model_config, self.parameters = model_config.load(args)
        model_config.apply_nice(self.parameters)
        self.metrics = StageMetrics(self.model_name)
        self.setup(args)

    def setup(self, args: dict) -> None:
        """Load what the model needs; override."""

    def teardown(self) -> None:
        """Release resources; override."""

    async def handle(self, ctx: RequestContext) -> AsyncIterator[tuple[dict, np.ndarray | None]]:
        raise NotImplementedError
        yield  # pragma: no cover  (makes this an async generator)

    def encode(self, event: dict, payload) -> dict[str, np.ndarray]:
        """Output tensors of one event (default: EVENT + AUDIO, `events.encode_event`); override for other
        payloads (e.g. images)."""
        return events.encode_event(event, payload)

    async def execute(self, requests) -> None:
        await asyncio.gather(*(self._serve(r) for r in requests))

    async def _serve(self, request) -> None:
        sender = request.get_response_sender()
        ctx = RequestContext(request, sender)
        outcome, error = "ok", None
        stream = self._answer(ctx)
        try:
            self.metrics.started()
            async for event, audio in stream:
                ctx.check()
                tensors = self.encode(event, audio)
                if not send_response(sender, ctx.request_id,
                                     pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in tensors.items()])):
                    raise Cancelled()
            ctx.check()
        except Cancelled:
            outcome = "cancelled"
        except RequestError as exc:
            outcome, error = "rejected" if exc.status < 500 else "error", exc.envelope()
        except Exception as exc:  # noqa: BLE001 - every failure must reach the client as an error + FINAL
            outcome, error = "error", f"{self.model_name}: {type(exc).__name__}: {exc}"
            pb_utils.Logger.log_error(f"{self.model_name} request {ctx.request_id} failed:\n{traceback.format_exc()}")
        finally:
            await stream.aclose()  # runs the handler's cleanup (e.g. cancels its BLS children)
            sidechannel.clear(ctx.request_id)
            self.metrics.finished(outcome)
        ctx.finish()
        send_final(sender, ctx.request_id, error)

    async def _answer(self, ctx: RequestContext):
        """The events of `handle(ctx)`, or the fields event for {"action": "fields"} (with `request_fields`, which
        the REQUEST of any action but `control_actions` must keep to)."""
        if self.request_fields is not None:
            body = ctx.body()
            if events.wants_fields(body):
                yield events.fields_event(self.request_fields, self.field_hints), None
                return
            if body.get("action") not in self.control_actions:
                events.require_known_fields(body, self.request_fields, self.model_name, self.field_hints)
        async with contextlib.aclosing(self.handle(ctx)) as stream:
            async for item in stream:
                yield item

    def finalize(self) -> None:
        self.teardown()
        retire.release()
        self.metrics.close()
