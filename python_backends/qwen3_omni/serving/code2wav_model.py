"""qwen3_omni_code2wav: the streaming vocoder as a stateful stage (sequence batching, non-decoupled).

One sequence (correlation id) is one chat turn. Each request brings the codec frames new since the
previous one and gets back the PCM that became final (float32, 24 kHz; possibly empty). Requests of
different sequences that Triton batches together (oldest-first strategy) are decoded by ONE
`Code2WavStreamer.step`: one vocoder forward per distinct window length. Config parameters
`chunk_frames`, `first_chunk_frames`, `left_context_frames` and `cuda_graphs` (first chunks from CUDA graphs, batch
buckets up to max_batch_size) set the streamer (see its doc).
Tensors: `omni_backends.qwen3_omni.serving.protocol`.

A sequence also ends after `max_sequence_idle_microseconds` (the config's sequence-batching idle
timeout, after which Triton frees its slot) without a request, so a turn whose ABORT was lost never
holds its streamer state for good, and within about a second once the BLS parent that started it is
gone (its stub crashed or was reloaded: `SequenceLeases`).

Metrics (`StageMetrics`): in-flight = live sequences (START until END, ABORT or idle timeout); step
time (phase "decode").
"""
from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from omni_backends.errors import RequestError
from omni_backends.qwen3_omni.code2wav import Code2WavStreamer
from omni_backends.qwen3_omni.loading import load_code2wav
from omni_backends.qwen3_omni.serving import protocol as p
from omni_backends.serving import model_config
from omni_backends.serving.metrics import StageMetrics
from omni_backends.serving.sequences import SequenceLeases


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.model_name, config, parameters = model_config.load(args)
        setup = p.stage_setup(args, parameters, self.model_name)
        max_batch = max(1, int(config.get("max_batch_size") or 1))
        self.streamer = Code2WavStreamer(load_code2wav(setup.path, device=setup.device, dtype=setup.dtype),
                                         **p.code2wav_settings(parameters, max_batch))
        self.streamer.warmup()
        self.metrics = StageMetrics(self.model_name)
        self._sequences: set[int] = set()
        self.leases = SequenceLeases(model_config.sequence_idle_seconds(config))
        self._lock = threading.Lock()             # execute vs the sweeper
        self._closed = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep_idle, name=f"{self.model_name}-idle", daemon=True)
        self._sweeper.start()

    def finalize(self) -> None:
        self._closed.set()
        self._sweeper.join(timeout=2)
        self.metrics.close()

    def execute(self, requests):
        with self._lock:
            return self._execute(requests)

    def _sweep_idle(self) -> None:
        while not self._closed.wait(min(self.leases.idle_s, 1.0)):
            with self._lock:
                for seq, why in self.leases.expired().items():
                    pb_utils.Logger.log_warn(f"{self.model_name}: sequence {seq} ended ({why})")
                    self._forget(seq, "cancelled")

    def _execute(self, requests):
        new_codes, final, errors = {}, [], {}
        for i, request in enumerate(requests):
            seq = int(request.correlation_id())
            try:
                self._admit(request, seq, new_codes, final)
            except RequestError as exc:
                errors[i] = exc.envelope()
                self._forget(seq, "rejected")
        started = time.monotonic()
        try:
            pcm = self.streamer.step(new_codes, final=final) if new_codes or final else {}
        except Exception as exc:  # noqa: BLE001 - the whole batch fails, each request gets the error
            pb_utils.Logger.log_error(f"{self.model_name} decode failed:\n{traceback.format_exc()}")
            for seq in [*new_codes, *final]:
                self._forget(seq, "error")
            error = pb_utils.TritonError(f"{self.model_name}: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if new_codes or final:
            self.metrics.observe("decode", time.monotonic() - started)
        for seq in final:
            self._sequences.discard(seq)
            self.leases.forget(seq)
            self.metrics.finished("ok")
        responses = []
        for i, request in enumerate(requests):
            if i in errors:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(errors[i])))
                continue
            samples = pcm.get(int(request.correlation_id()), np.zeros(0, np.float32))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(p.PCM, samples[None])]))
        return responses

    def _admit(self, request, seq: int, new_codes: dict, final: list) -> None:
        """Sort one request into this batch's `new_codes` / `final` (or apply its ABORT)."""
        def tensor(name):
            found = pb_utils.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy()[0]   # drop the batch dim

        if p.flag(tensor(p.ABORT)):
            self.streamer.cancel(seq)
            self._forget(seq, "cancelled")
            return
        if p.flag(tensor(p.START)) and seq not in self._sequences:
            self._sequences.add(seq)
            self.metrics.started()
        if seq in self._sequences:
            self.leases.touch(seq, request.request_id())
        elif seq not in self._sequences:
            raise RequestError(f"code2wav sequence {seq} is not live (send START first)")
        codes = tensor(p.CODES)
        if codes is None or codes.ndim != 2 or codes.shape[0] != self.streamer.groups:
            raise RequestError(f"{p.CODES} must be int64 [{self.streamer.groups}, frames]")
        new_codes[seq] = torch.from_numpy(codes.astype(np.int64))
        if p.flag(tensor(p.END)):
            final.append(seq)

    def _forget(self, seq: int, outcome: str) -> None:
        self.leases.forget(seq)
        if seq in self._sequences:
            self._sequences.discard(seq)
            self.streamer.cancel(seq)
            self.metrics.finished(outcome)
