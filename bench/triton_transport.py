"""`--transport triton`: chat workloads sent straight to a client-facing Triton model over gRPC streaming.

Skips the frontend (useful where it cannot run, e.g. a GPU machine without the frontend's packages)
and measures Triton and the pipeline alone. The request is the pipeline REQUEST JSON the frontend
would send (`omni_frontend.chat_protocol.to_pipeline`: messages with text parts, modalities, voice,
temperature 0, max_tokens, extension fields from --extra-body); the responses are the pipeline's
events (`omni_backends.serving.events`): `text.delta` -> a text chunk, `audio.delta` + AUDIO float32 ->
an audio chunk of len(AUDIO) samples at the event's `sample_rate`, `done` -> usage. Arrival times are
taken in tritonclient's stream callback. No model code.
"""
from __future__ import annotations

import asyncio
import json
import queue
import time
import uuid

import numpy as np

from omni_bench.client import RequestOptions, StreamError, text_tokens
from omni_bench.records import AUDIO, OTHER, TEXT, RequestRecord

TRANSPORTS = ("http", "triton")


def request_body(options: RequestOptions, prompt: str) -> dict:
    """The pipeline REQUEST JSON of one chat request (what the frontend builds for the same HTTP request)."""
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            "modalities": ["text", "audio"] if options.workload == "chat-audio" else ["text"],
            "voice": options.voice, "temperature": 0.0, "max_tokens": options.max_tokens, "stop": []}
    return {k: v for k, v in {**body, **options.extra_body}.items() if v is not None}


async def send_triton(url: str, options: RequestOptions, index: int, prompt: str, run_start: float,
                      timeout_s: float) -> RequestRecord:
    """Send one chat request to Triton model `options.model` at `url` (host:port); failures land in `record.error`."""
    record = RequestRecord(index=index, prompt=prompt)
    sent = time.perf_counter()
    record.send_time = sent - run_start
    try:
        await asyncio.to_thread(_stream, url, options, record, sent, timeout_s)
    except (StreamError, ValueError, KeyError, OSError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    return record


def _stream(url: str, options: RequestOptions, record: RequestRecord, sent: float, timeout_s: float) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    arrivals: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: arrivals.put((time.perf_counter(), result, error)))
        tensor = grpcclient.InferInput("REQUEST", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([json.dumps(request_body(options, record.prompt)).encode()],
                                            dtype=np.object_))
        client.async_stream_infer(options.model, [tensor], request_id=uuid.uuid4().hex,
                                  enable_empty_final_response=True)
        text = []
        while True:
            try:
                arrived, result, error = arrivals.get(timeout=timeout_s)
            except queue.Empty:
                raise StreamError(f"no response within {timeout_s} s") from None
            if error is not None:
                raise StreamError(str(error))
            t = arrived - sent
            response = result.get_response()
            if response.outputs:
                _record_event(record, t, result, text)
            if response.parameters["triton_final_response"].bool_param:
                break
        record.text = "".join(text)
    except InferenceServerException as exc:
        raise StreamError(str(exc)) from exc
    finally:
        client.stop_stream()
        client.close()


def _record_event(record: RequestRecord, t: float, result, text: list[str]) -> None:
    event = json.loads(result.as_numpy("EVENT")[0])
    kind = event.get("type")
    if kind == "text.delta" and event.get("text"):
        text.append(event["text"])
        record.add(t, TEXT, len(event["text"]))
    elif kind == "audio.delta":
        audio = result.as_numpy("AUDIO")
        samples = 0 if audio is None else int(audio.size)
        record.sample_rate = event.get("sample_rate") or record.sample_rate
        record.add(t, AUDIO, samples * 2, samples)
    elif kind == "error":
        raise StreamError(f"error event: {json.dumps(event)[:500]}")
    else:
        if kind == "done":
            record.completion_tokens = text_tokens(event.get("usage") or {})
        record.add(t, OTHER)
