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

Limits (a request is one call of `execute`, and the stage has one instance: one caller must not stall every
turn's speech):
- A sequence carries at most `max_frames` frames in all (config parameter; default 4095, the talker's own
  `max_frames`, i.e. the longest turn the pipeline speaks: 4095 x 80 ms = 327.6 s). A request that would take
  its sequence past it is refused at once (400 naming the limit) and the sequence is dropped.
- At most `max_sequences` sequences (config parameter; default 256) are live: a START beyond them is refused
  at once (429 `too_many_sequences`) rather than left to wait for one of Triton's slots (there are many more).
- A request bringing many frames at once (a direct client sending a whole turn) is decoded in pieces of
  `4 * chunk_frames` frames, the same windows a streamed turn gets; between pieces the stage asks whether
  the caller is still there (`request.is_cancelled()`, or the BLS side channel for the orchestrator's
  requests) and drops the sequence of one that left (a client deadline, a closed stream): its request gets
  a "cancelled" error and the other sequences of the batch go on.

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
from omni_backends.serving import model_config, sidechannel
from omni_backends.serving.metrics import StageMetrics
from omni_backends.serving.sequences import SequenceLeases, check_room


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.model_name, config, parameters = model_config.load(args)
        setup = p.stage_setup(args, parameters, self.model_name)
        max_batch = max(1, int(config.get("max_batch_size") or 1))
        self.streamer = Code2WavStreamer(load_code2wav(setup.path, device=setup.device, dtype=setup.dtype),
                                         **p.code2wav_settings(parameters, max_batch))
        self.streamer.warmup()
        self.metrics = StageMetrics(self.model_name)
        # frames per sequence (the longest turn the talker speaks) and per decode between cancellation checks
        self.max_frames = model_config.int_parameter(parameters, "max_frames", 4095)
        self.max_sequences = model_config.int_parameter(parameters, "max_sequences", 256)
        self.piece_frames = 4 * self.streamer.chunk_frames
        self._frames: dict[int | str, int] = {}   # live sequence -> frames received so far
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
        owner: dict[int | str, int] = {}          # sequence -> index of its request in this batch
        for i, request in enumerate(requests):
            seq = request.correlation_id()
            try:
                self._admit(request, seq, new_codes, final)
                owner[seq] = i
            except RequestError as exc:
                errors[i] = exc.envelope()
                self._forget(seq, "rejected")
        started = time.monotonic()
        pcm: dict[int | str, list[np.ndarray]] = {}
        try:
            # decode in pieces of piece_frames frames per sequence, dropping the sequences whose caller left
            offset, rounds, left = 0, 0, sidechannel.request_abandoned
            while new_codes or final:
                if rounds and (gone := [s for s in [*new_codes, *final] if left(requests[owner[s]])]):
                    for seq in gone:
                        errors[owner[seq]] = f"{self.model_name}: request cancelled (the caller left)"
                        new_codes.pop(seq, None)
                        if seq in final:
                            final.remove(seq)
                        self._forget(seq, "cancelled")
                    if not (new_codes or final):
                        break
                piece = {s: c[:, offset:offset + self.piece_frames] for s, c in new_codes.items()}
                done = [s for s in final   # a final sequence ends with its last piece
                        if new_codes.get(s) is None or new_codes[s].shape[-1] <= offset + self.piece_frames]
                for seq, samples in self.streamer.step(piece, final=done).items():
                    pcm.setdefault(seq, []).append(samples)
                offset, rounds = offset + self.piece_frames, rounds + 1
                new_codes = {s: c for s, c in new_codes.items() if c.shape[-1] > offset}
                for seq in done:
                    final.remove(seq)
                    self._sequences.discard(seq)
                    self._frames.pop(seq, None)
                    self.leases.forget(seq)
                    self.metrics.finished("ok")
        except Exception as exc:  # noqa: BLE001 - the whole batch fails, each request gets the error
            pb_utils.Logger.log_error(f"{self.model_name} decode failed:\n{traceback.format_exc()}")
            for seq in [*new_codes, *final]:
                self._forget(seq, "error")
            error = pb_utils.TritonError(f"{self.model_name}: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        if pcm:
            self.metrics.observe("decode", time.monotonic() - started)
        responses = []
        for i, request in enumerate(requests):
            if i in errors:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(errors[i])))
                continue
            parts = pcm.get(request.correlation_id())
            samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(p.PCM, samples[None])]))
        return responses

    def _admit(self, request, seq: int | str, new_codes: dict, final: list) -> None:
        """Sort one request into this batch's `new_codes` / `final` (or apply its ABORT)."""
        def tensor(name):
            found = pb_utils.get_input_tensor_by_name(request, name)
            return None if found is None else found.as_numpy()[0]   # drop the batch dim

        if p.flag(tensor(p.ABORT)):
            self.streamer.cancel(seq)
            self._forget(seq, "cancelled")
            return
        if p.flag(tensor(p.START)) and seq not in self._sequences:
            check_room(self.model_name, len(self._sequences), self.max_sequences)
            self._sequences.add(seq)
            self.metrics.started()
        if seq in self._sequences:
            self.leases.touch(seq, request.request_id())
        elif seq not in self._sequences:
            raise RequestError(f"code2wav sequence {seq} is not live (send START first)")
        codes = tensor(p.CODES)
        if codes is None or codes.ndim != 2 or codes.shape[0] != self.streamer.groups:
            raise RequestError(f"{p.CODES} must be int64 [{self.streamer.groups}, frames]")
        frames = self._frames.get(seq, 0) + codes.shape[-1]
        if frames > self.max_frames:
            raise RequestError(f"{p.CODES}: a code2wav sequence carries at most {self.max_frames} frames "
                               f"({self.max_frames * 0.08:.1f} s of audio, the talker's max_frames); this request "
                               f"would bring it to {frames}", param=p.CODES, code="too_many_frames")
        self._frames[seq] = frames
        new_codes[seq] = torch.from_numpy(codes.astype(np.int64))
        if p.flag(tensor(p.END)):
            final.append(seq)

    def _forget(self, seq: int | str, outcome: str) -> None:
        self.leases.forget(seq)
        self._frames.pop(seq, None)
        if seq in self._sequences:
            self._sequences.discard(seq)
            self.streamer.cancel(seq)
            self.metrics.finished(outcome)
