"""Streaming code2wav: codec frames -> 24 kHz PCM chunks, per request, with left context.

The vocoder (`transformers` `Qwen3OmniMoeCode2Wav`) is causal but its transposed convolutions trim a fixed
number of trailing samples (555 with the real config): `codes[16, n]` decode to `n * 1920 - 555` samples.
The library's `chunked_decode` drops those samples at every chunk boundary. This streamer holds them back
and re-emits them from the next chunk (decoded with left context), so when the left context covers all
previous frames the concatenated chunks equal one full decode.

With `graphs` on and the model on CUDA every decode replays a CUDA graph: the vocoder is ~800 small eager launches
(an 8-layer transformer, ConvNeXt upsampling, Snake activations), ~35 ms of host time for a batch of 16 later chunks
that stalls the other engine threads of the process (docs/gpu.md, run 19). The windows are right-padded to one of two
lengths, `first_chunk_frames` (first chunks: the decode on every request's way to its first audio) or
`left_context_frames + chunk_frames` (every later chunk), and the batch to a power of two (zero rows): one graph per
(batch bucket, length). The vocoder is causal (causal convolutions, transposed convolutions trimmed on the right,
sliding-window causal attention), so right padding leaves the real samples as the unpadded decode computes them
(rounding aside); the padded samples are dropped. Longer windows, or more rows than the largest bucket, run eagerly.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from omni_backends.engine.graphs import StepGraphs, batch_bucket, power_of_two_buckets

SAMPLE_RATE = 24000   # Hz; Qwen3-Omni's code2wav output rate (not stored in the config)


@dataclass
class _Sequence:
    codes: torch.Tensor                 # int64 [groups, n] frames from `first_frame` on
    first_frame: int = 0                # absolute index of codes[:, 0]
    decoded_frames: int = 0             # frames whose samples were emitted (except the held-back tail)
    started: bool = field(default=False)

    @property
    def total_frames(self) -> int:
        return self.first_frame + self.codes.shape[-1]


class Code2WavStreamer:
    """Per-request streaming decoder over one `Qwen3OmniMoeCode2Wav`; decodes ready chunks of all
    requests in one batched forward per window length.

    Args:
        model: a `Qwen3OmniMoeCode2Wav` (eval mode) on any device.
        chunk_frames: frames per chunk after the first (1 frame = 1920 samples = 80 ms with the real config).
        first_chunk_frames: frames of the first chunk (smaller = earlier first audio).
        left_context_frames: frames before a chunk decoded with it and discarded; must cover the trimmed
            tail (>= ceil(trim / samples_per_frame), i.e. >= 1). Context >= all previous frames is exact.
        graphs: replay the decodes from CUDA graphs (module doc; ignored on CPU). max_batch: the largest batch
            bucket of those graphs (more windows at once run eagerly).

    Raises:
        ValueError: on a non-positive chunk size or a left context too short to re-emit the held-back tail.
    """

    def __init__(self, model, chunk_frames: int = 25, first_chunk_frames: int = 5, left_context_frames: int = 25,
                 graphs: bool = False, max_batch: int = 32):
        if chunk_frames < 1 or first_chunk_frames < 1:
            raise ValueError(f"chunk sizes must be >= 1 frame, got {chunk_frames=} {first_chunk_frames=}")
        self.model = model
        self.groups = model.config.num_quantizers
        self.samples_per_frame = int(model.total_upsample)
        self.trim = self._trimmed_samples()
        min_context = math.ceil(self.trim / self.samples_per_frame)
        if left_context_frames < min_context:
            raise ValueError(f"left_context_frames must be >= {min_context} to re-emit the {self.trim} held-back "
                             f"samples at chunk boundaries, got {left_context_frames}")
        self.chunk_frames, self.first_chunk_frames = chunk_frames, first_chunk_frames
        self.left_context_frames = left_context_frames
        self._sequences: dict[str, _Sequence] = {}
        self.buckets = power_of_two_buckets(max_batch)
        self.lengths = (first_chunk_frames, left_context_frames + chunk_frames)   # the graphs' window lengths
        self.graphs = StepGraphs(lambda codes: (self.model(codes),), enabled=graphs, name="code2wav")
        # windows right-padded to `lengths` (where the graphs replay: CUDA)
        self.pad_windows = graphs and next(model.parameters()).device.type == "cuda"

    @torch.no_grad()
    def _trimmed_samples(self) -> int:
        """Samples a decode of n frames lacks relative to n * samples_per_frame (555 for the real config)."""
        device = next(self.model.parameters()).device
        probe = torch.zeros(1, self.groups, 2, dtype=torch.long, device=device)
        return 2 * self.samples_per_frame - self.model(probe).shape[-1]

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._sequences

    def push(self, request_id: str, codes: torch.Tensor) -> np.ndarray:
        """Add frames of one request; returns the PCM that became final (float32 [samples], maybe empty).

        codes: int64 [16, n] codec frames at 12.5 Hz (layout of transformers `Qwen3OmniMoeCode2Wav` input).
        """
        return self.step({request_id: codes})[request_id]

    def flush(self, request_id: str) -> np.ndarray:
        """Decode the remaining frames of a request, forget it, return its last PCM (float32 [samples])."""
        return self.step({}, final=[request_id])[request_id]

    def cancel(self, request_id: str) -> None:
        """Forget a request without decoding (no error when it is unknown)."""
        self._sequences.pop(request_id, None)

    @torch.no_grad()
    def step(self, new_codes: Mapping[str, torch.Tensor], final: Collection[str] = ()) -> dict[str, np.ndarray]:
        """Add frames for several requests, decode every ready chunk in batched forwards.

        Args:
            new_codes: request id -> int64 [16, n] new frames (n may be 0). Unknown ids start a sequence.
            final: request ids whose stream ends now: all their frames are decoded and they are forgotten.

        Returns:
            request id -> float32 [samples] PCM at 24 kHz for every id in new_codes or final (empty when
            nothing became final yet).

        Raises:
            ValueError: on codes that are not [16, n], or a final id with no frames ever pushed.
        """
        for rid, codes in new_codes.items():
            self._append(rid, codes)
        for rid in final:
            if rid not in self._sequences:
                raise ValueError(f"code2wav: no frames were pushed for request {rid!r}")
        windows = {rid: w for rid in self._sequences if (w := self._ready_window(rid, rid in final))}
        pcm = self._decode(windows)
        out = {rid: pcm.get(rid, np.zeros(0, np.float32)) for rid in [*new_codes, *final]}
        for rid in final:
            del self._sequences[rid]
        return out

    def _append(self, rid: str, codes: torch.Tensor) -> None:
        if codes.ndim != 2 or codes.shape[0] != self.groups:
            raise ValueError(f"code2wav expects codes [{self.groups}, n], got {tuple(codes.shape)}")
        codes = codes.to(torch.long)
        seq = self._sequences.get(rid)
        if seq is None:
            self._sequences[rid] = _Sequence(codes=codes.clone())
        else:
            seq.codes = torch.cat([seq.codes, codes], dim=-1)

    def _ready_window(self, rid: str, final: bool) -> tuple[int, int, int] | None:
        """(start, context, end) absolute frames of the next decode of `rid`, or None when not ready."""
        seq = self._sequences[rid]
        begin = seq.decoded_frames
        pending = seq.total_frames - begin
        size = self.chunk_frames if seq.started else self.first_chunk_frames
        if pending == 0 or (pending < size and not final):
            return None
        end = seq.total_frames if final else begin + pending // size * size
        context = min(self.left_context_frames, begin)
        return begin - context, context, end

    def _decode(self, windows: dict[str, tuple[int, int, int]]) -> dict[str, np.ndarray]:
        """Decode all windows, one forward per decoded length (a graph's padded length, else the window's own);
        emit and trim each sequence."""
        device = next(self.model.parameters()).device
        by_length: dict[int, list[str]] = {}
        for rid, (start, _, end) in windows.items():
            frames = end - start
            length = next((n for n in self.lengths if frames <= n), frames) if self.pad_windows else frames
            by_length.setdefault(length, []).append(rid)
        out = {}
        for length, rids in by_length.items():
            batch = torch.zeros(len(rids), self.groups, length, dtype=torch.long)
            for row, rid in enumerate(rids):
                codes = self._window_codes(rid, *windows[rid])
                batch[row, :, :codes.shape[-1]] = codes
            wav = self._vocode(batch.to(device))[:, 0].float().cpu().numpy()
            for row, rid in enumerate(rids):
                start, _, end = windows[rid]
                out[rid] = self._emit(rid, wav[row, :(end - start) * self.samples_per_frame - self.trim], *windows[rid])
        return out

    def _vocode(self, batch: torch.Tensor) -> torch.Tensor:
        """The vocoder over windows [n, 16, frames]: a graph replay of (batch bucket, frames) when `frames` is one
        of the graphs' lengths on CUDA (rows are independent: zero rows pad the batch), else eager. Returns wav
        [n, 1, frames * samples_per_frame - trim]."""
        n, frames = batch.shape[0], batch.shape[-1]
        if not (batch.is_cuda and self.graphs.enabled) or n > self.buckets[-1] or frames not in self.lengths:
            return self.model(batch)
        bucket = batch_bucket(n, self.buckets)
        padded = batch.new_zeros(bucket, *batch.shape[1:])
        padded[:n] = batch
        return self.graphs.run((bucket, frames), {"codes": padded})[0][:n]

    @torch.no_grad()
    def warmup(self) -> int:
        """Capture the graph of every (batch bucket, window length) before serving (CUDA with graphs only); returns
        the graphs captured."""
        device = next(self.model.parameters()).device
        if device.type != "cuda" or not self.graphs.enabled:
            return 0
        for frames in self.lengths:
            for bucket in self.buckets:
                self._vocode(torch.zeros(bucket, self.groups, frames, dtype=torch.long, device=device))
        torch.cuda.synchronize(device)
        return self.graphs.stats().captured

    def _window_codes(self, rid: str, start: int, _context: int, end: int) -> torch.Tensor:
        seq = self._sequences[rid]
        return seq.codes[:, start - seq.first_frame:end - seq.first_frame]

    def _emit(self, rid: str, wav: np.ndarray, start: int, context: int, end: int) -> np.ndarray:
        """Samples of `wav` not emitted before: skip the context minus the tail held back last time."""
        seq = self._sequences[rid]
        skip = context * self.samples_per_frame - (self.trim if seq.started else 0)
        seq.started, seq.decoded_frames = True, end
        keep_from = max(0, end - self.left_context_frames)
        seq.codes, seq.first_frame = seq.codes[:, keep_from - seq.first_frame:], keep_from
        return np.ascontiguousarray(wav[skip:], dtype=np.float32)
