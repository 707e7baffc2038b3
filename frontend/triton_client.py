"""Async Triton gRPC client: one bidirectional ModelStreamInfer call per request.

Built on grpc.aio and tritonclient's protobufs (tritonclient's own aio client cannot ask for the
empty FINAL response that ends a decoupled stream). Cancelling the consuming task (for example
when the HTTP client disconnects) cancels the gRPC call, which Triton turns into
`is_cancelled() == True` inside the model.
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

from omni_frontend.errors import APIError, from_triton_message

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


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
    """Connection to one tritonserver's gRPC endpoint (host:port)."""

    def __init__(self, url: str, timeout_s: float = 600.0):
        self.url, self.timeout_s = url, timeout_s
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

    async def server_ready(self) -> bool:
        try:
            return (await self._stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=2)).ready
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
        503 when Triton is unreachable, 504 after `timeout_s`.
        Closing the generator early (or cancelling its task) cancels the request in Triton.
        """
        request = _get_inference_request(
            model_name=model, inputs=_infer_inputs(inputs), model_version="", request_id=request_id or uuid.uuid4().hex,
            outputs=None, sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None,
            parameters=parameters)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        finished = asyncio.Event()

        async def requests():
            yield request
            await finished.wait()  # keep our half of the stream open until the FINAL response

        call = self._stub.ModelStreamInfer(requests(), timeout=self.timeout_s)
        try:
            async for reply in call:
                if reply.error_message:
                    raise from_triton_message(reply.error_message)
                final = reply.infer_response.parameters["triton_final_response"].bool_param
                outputs = _outputs(reply.infer_response) if reply.infer_response.outputs else {}
                if outputs or final:
                    yield StreamResponse(outputs, final)
                if final:
                    return
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from exc
        finally:
            finished.set()
            if not call.done():
                call.cancel()

    async def infer(self, model: str, inputs: dict[str, np.ndarray], request_id: str | None = None, *,
                    sequence_id: int = 0, sequence_start: bool = False, sequence_end: bool = False) -> dict[str, np.ndarray]:
        """One non-decoupled inference (ModelInfer); raises APIError like `stream`. For a sequence-batched
        model pass its correlation id as `sequence_id` and flag the first/last request."""
        request = _get_inference_request(
            model_name=model, inputs=_infer_inputs(inputs), model_version="", request_id=request_id or uuid.uuid4().hex,
            outputs=None, sequence_id=sequence_id, sequence_start=sequence_start, sequence_end=sequence_end,
            priority=0, timeout=None, parameters=None)
        try:
            reply = await self._stub.ModelInfer(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(exc) from exc
        return _outputs(reply)


def _rpc_error(exc: grpc.aio.AioRpcError) -> APIError:
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return APIError(503, f"inference server unavailable: {exc.details()}", code="triton_unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, "inference timed out", code="timeout")
    if code == grpc.StatusCode.CANCELLED:
        return APIError(499, "request cancelled", code="cancelled")
    return from_triton_message(exc.details() or str(code))
