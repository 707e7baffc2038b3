"""Realtime audio codecs (PyAV): the client's input format -> float32 16 kHz for the VAD and ASR stages,
and the pipeline's float32 24 kHz speech -> the session's output format. Resamplers keep their state
across chunks, so a stream cut into any chunk sizes resamples like one piece."""
from __future__ import annotations

import base64
import binascii

import av
import numpy as np

from omni_frontend.audio import pcm16
from omni_frontend.realtime.protocol import ProtocolError

STAGE_RATE = 16000  # the VAD and ASR stages take float32 mono 16 kHz
_G711 = {"pcmu": "pcm_mulaw", "pcma": "pcm_alaw"}


def b64decode(data: str, param: str) -> bytes:
    """Strict base64; raises ProtocolError (code invalid_base64) naming `param`."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"{param} is not valid base64: {exc}", code="invalid_base64", param=param) from None


def _resampler(rate: int, fmt: str = "flt") -> av.AudioResampler:
    return av.AudioResampler(format=fmt, layout="mono", rate=rate)


def _run(resampler: av.AudioResampler | None, pcm: np.ndarray, rate: int) -> np.ndarray:
    """float32 [n] at `rate` through a stateful resampler (None: unchanged)."""
    if resampler is None or pcm.size == 0:
        return pcm
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="flt", layout="mono")
    frame.sample_rate = rate
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


class InputDecoder:
    """Client audio (`input_audio_buffer.append` payloads) -> float32 mono 16 kHz.

    fmt: "pcm" (little-endian int16 at `rate`: 24000, 16000 or 8000 Hz), "pcmu" or "pcma" (G.711, 8 kHz).
    """

    def __init__(self, fmt: str, rate: int):
        self.fmt, self.rate = fmt, rate
        self._g711 = None
        if fmt in _G711:
            self._g711 = av.CodecContext.create(_G711[fmt], "r")
            self._g711.sample_rate, self._g711.layout = rate, "mono"
        self._resampler = None if rate == STAGE_RATE else _resampler(STAGE_RATE)

    def seconds(self, data: bytes) -> float:
        """The duration of a payload, from its length alone (checked before decoding it): PCM16 is 2 bytes a
        sample at `rate`, G.711 one byte a sample at 8 kHz."""
        return len(data) / (self.rate * (1 if self._g711 is not None else 2))

    def decode(self, data: bytes, param: str = "audio") -> np.ndarray:
        """float32 [samples] at 16 kHz for one payload. Raises ProtocolError (naming `param`, the client
        event's field) for a PCM payload of odd length."""
        if self._g711 is not None:
            frames = self._g711.decode(av.Packet(data)) if data else []
            pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0, np.int16)
        else:
            if len(data) % 2:
                raise ProtocolError("PCM16 audio must have an even number of bytes", code="invalid_audio", param=param)
            pcm = np.frombuffer(data, dtype="<i2")
        return _run(self._resampler, pcm.astype(np.float32) / 32768.0, self.rate)


def stage_audio_as(kept: np.ndarray, fmt: str, rate: int) -> bytes:
    """User audio as the stages took it (int16 [samples] at STAGE_RATE) -> bytes in a session's input format
    (`fmt` "pcm" at `rate`, or "pcmu" / "pcma" at 8 kHz), resampled whole: what conversation.item.retrieve
    returns in an input_audio part's `audio`."""
    pcm = kept.astype(np.float32) / 32767.0   # the inverse of pcm16(): the same samples back at STAGE_RATE
    if rate != STAGE_RATE and pcm.size:
        resampler = _resampler(rate)
        pcm = np.concatenate([_run(resampler, pcm, STAGE_RATE)] +
                             [f.to_ndarray().reshape(-1).astype(np.float32) for f in resampler.resample(None)])
    return OutputEncoder(fmt, rate).encode(pcm, rate)


class OutputEncoder:
    """Pipeline speech (float32 mono at the pipeline's rate) -> bytes in the session's output format:
    PCM16 at 24 kHz, or G.711 μ-law / A-law at 8 kHz."""

    def __init__(self, fmt: str, rate: int):
        self.fmt, self.rate = fmt, rate
        self._resamplers: dict[int, av.AudioResampler] = {}
        self._g711 = None
        if fmt in _G711:
            self._g711 = av.CodecContext.create(_G711[fmt], "w")
            self._g711.sample_rate, self._g711.layout, self._g711.format = rate, "mono", "s16"

    def encode(self, pcm: np.ndarray, rate: int) -> bytes:
        if rate != self.rate:
            pcm = _run(self._resamplers.setdefault(rate, _resampler(self.rate)), np.asarray(pcm, np.float32), rate)
        if self._g711 is None:
            return pcm16(pcm)
        samples = np.frombuffer(pcm16(pcm), dtype="<i2")
        if samples.size == 0:
            return b""
        frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        frame.sample_rate = self.rate
        return b"".join(bytes(packet) for packet in self._g711.encode(frame))

    def duration_ms(self, data: bytes) -> float:
        """Play time of encoded bytes in milliseconds."""
        return len(data) / (2 if self._g711 is None else 1) / self.rate * 1000.0
