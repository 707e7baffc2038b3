"""Async Triton gRPC client: one bidirectional ModelStreamInfer call per request.

Built on grpc.aio and tritonclient's protobufs (tritonclient's own aio client cannot ask for the
empty FINAL response that ends a decoupled stream). Cancelling the consuming task (for example
when the HTTP client disconnects) cancels the gRPC call, which Triton turns into
`is_cancelled() == True` inside the model. Every call is tracked in `availability`: a call through
a model that is marked down (its stub died) is refused or, in flight, failed at once with 503.
Also the model-control calls (load, unload, repository index) of explicit model control.
"""
from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

import grpc
import numpy as np
from tritonclient.grpc import InferInput, InferResult, service_pb2, service_pb2_grpc
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import np_to_triton_dtype

from omni_frontend.availability import Availability, first_of
from omni_frontend.errors import APIError, from_triton_message

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
# How the stages recognise a BLS child request by its id (omni_backends.serving.sidechannel: "bls-<pid>_<start>-...");
# a child's responses, FINAL and errors go through the side channel of its parent process, not back to the caller.
_BLS_CHILD_PREFIX = "bls-"


def triton_request_id(request_id: str | None) -> str:
    """The Triton request id of a call made with `request_id` (a client's x-request-id is honoured; None: a fresh
    id), never one that a stage would take for a BLS child's: such a request's error reached only the side channel
    (the client got a 200 with a cut answer), or, naming a parent process that is not there, its answer and FINAL
    were never sent and the stream hung."""
    if not request_id:
        return uuid.uuid4().hex
    return f"http-{request_id}" if request_id.startswith(_BLS_CHILD_PREFIX) else request_id


@dataclasses.dataclass
class StreamResponse:
    """One response of a decoupled stream: its output tensors (name -> array) and whether it was FINAL."""

    outputs: dict[str, np.ndarray]
    final: bool


def _infer_inputs(inputs: dict[str, np.ndarray]) -> list[InferInput]:
    built = []
    for name, array in inputs.items():
        tensor = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        built.append(tensor)
    return built


def _outputs(response: service_pb2.ModelInferResponse) -> dict[str, np.ndarray]:
    result = InferResult(response)
    return {o.name: result.as_numpy(o.name) for o in response.outputs}


class TritonClient:
    """Connection to one tritonserver's gRPC endpoint (host:port); `availability` (default: every model
    available) says which models may take calls."""

    def __init__(self, url: str, timeout_s: float = 600.0, availability: Availability | None = None):
        self.url, self.timeout_s = url, timeout_s
        self.availability = availability or Availability()
        self._channel: grpc.aio.Channel | None = None
        self._stub_instance = None

    @property
    def _stub(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        # grpc.aio channels bind to the running event loop: open on first use inside the server's loop.
        if self._stub_instance is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=_CHANNEL_OPTIONS)
            self._stub_instance = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub_instance

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub_instance = None

    async def server_live(self) -> bool:
        """Whether tritonserver runs and serves (it has initialized and is not exiting). Not its readiness:
        with strict readiness that is false while ANY model of the repository loads or unloads (a pipeline
        falling asleep or waking), which says nothing about the other models; judge those one by one."""
        try:
            return (await self._stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=2)).live
        except grpc.RpcError:
            return False

    async def model_ready(self, model: str) -> bool:
        try:
            reply = await self._stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=2)
            return reply.ready
        except grpc.RpcError:
            return False

    async def stream(self, model: str, inputs: dict[str, np.ndarray], request_id: str | None = None,
                     parameters: dict | None = None) -> AsyncIterator[StreamResponse]:
        """Sends one request to a decoupled model; yields its responses until the FINAL one.

        inputs: tensor name -> numpy array (object arrays of bytes for BYTES tensors).
        Raises APIError: the model's error (4xx when the model sent an OpenAI envelope, else 500),
        503 when Triton is unreachable or a model on the way is down, 504 after `timeout_s`.
        Closing the generator early (or cancelling its task) cancels the request in Triton.
        """
        request = _get_inference_request(
            model_name=model, inputs=_infer_inputs(inputs), model_version="", request_id=triton_request_id(request_id),
            outputs=None, sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None,
            parameters=parameters)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        finished = asyncio.Event()

        async def requests():
            yield request
            await finished.wait()  # keep our half of the stream open until the FINAL response

        with self.availability.track(model) as failure:
            call = self._stub.ModelStreamInfer(requests(), timeout=self.timeout_s)
            completed = False  # the request got its FINAL: end the RPC gracefully, do not cancel it
            try:
                while (reply := await first_of(call.read(), failure)) is not grpc.aio.EOF:
                    if reply.error_message:
                        completed = _is_final(reply) or await _until_final(call)
                        raise from_triton_message(reply.error_message)
                    completed = _is_final(reply)
                    outputs = _outputs(reply.infer_response) if reply.infer_response.outputs else {}
                    if outputs or completed:
                        yield StreamResponse(outputs, completed)
                    if completed:
                        return
            except grpc.aio.AioRpcError as exc:
                raise _rpc_error(exc) from exc
            finally:
                finished.set()  # closes our half of the stream
                if completed:
                    await _rpc_end(call)
                if not call.done():
                    call.cancel()

    async def infer(self, model: str, inputs: dict[str, np.ndarray], request_id: str | None = None, *,
                    sequence_id: int = 0, sequence_start: bool = False, sequence_end: bool = False,
                    timeout_s: float | None = None) -> dict[str, np.ndarray]:
        """One non-decoupled inference (ModelInfer); raises APIError like `stream` (504 after `timeout_s`, the
        client's default when None). For a sequence-batched model pass its correlation id as `sequence_id` and
        flag the first/last request."""
        request = _get_inference_request(
            model_name=model, inputs=_infer_inputs(inputs), model_version="", request_id=triton_request_id(request_id),
            outputs=None, sequence_id=sequence_id, sequence_start=sequence_start, sequence_end=sequence_end,
            priority=0, timeout=None, parameters=None)
        with self.availability.track(model) as failure:
            try:
                reply = await first_of(self._stub.ModelInfer(request, timeout=timeout_s or self.timeout_s), failure)
            except grpc.aio.AioRpcError as exc:
                raise _rpc_error(exc) from exc
        return _outputs(reply)

    # -- model control (explicit mode) ----------------------------------------------------------
    async def load_model(self, model: str, timeout_s: float = 600.0) -> None:
        """Loads (or reloads: a fresh stub) `model`; returns once it is READY. Raises APIError."""
        await self._control(self._stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name=model),
                                                           timeout=timeout_s))

    async def unload_model(self, model: str) -> None:
        """Starts unloading `model` (Triton finishes it once the model's requests in flight end). Raises APIError."""
        await self._control(self._stub.RepositoryModelUnload(
            service_pb2.RepositoryModelUnloadRequest(model_name=model), timeout=30))

    async def model_states(self) -> dict[str, str]:
        """{model: state} of the repository index (READY, UNLOADING, UNAVAILABLE, ...)."""
        reply = await self._control(self._stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), timeout=10))
        return {m.name: m.state for m in reply.models}

    @staticmethod
    async def _control(call):
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise APIError(503, f"model control failed: {exc.details()}", code="model_control_failed") from exc


def _is_final(reply) -> bool:
    """The reply ends its request (Triton's `triton_final_response` parameter)."""
    parameter = reply.infer_response.parameters.get("triton_final_response")
    return parameter is not None and parameter.bool_param


async def _until_final(call, timeout_s: float = 5.0) -> bool:
    """After an error response without FINAL, read on to the request's FINAL before the call is closed
    (cancelling the stream in between could leave the request in flight in Triton for good, so that
    its model could never be unloaded). Returns whether the FINAL came within timeout_s."""
    async def read():
        while (reply := await call.read()) is not grpc.aio.EOF:
            if _is_final(reply):
                return True
        return False

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except (asyncio.TimeoutError, grpc.aio.AioRpcError):
        return False


async def _rpc_end(call, timeout_s: float = 5.0) -> None:
    """Wait for Triton to end a stream whose request completed and whose request side we closed (a
    cancel right after the FINAL raced with Triton's own completion of the request)."""
    try:
        await asyncio.wait_for(call.code(), timeout_s)
    except (asyncio.TimeoutError, grpc.aio.AioRpcError):
        pass


def _rpc_error(exc: grpc.aio.AioRpcError) -> APIError:
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return APIError(503, f"inference server unavailable: {exc.details()}", code="triton_unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, "inference timed out", code="timeout")
    if code == grpc.StatusCode.CANCELLED:
        return APIError(499, "request cancelled", code="cancelled")
    return from_triton_message(exc.details() or str(code))
