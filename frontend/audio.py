"""Audio codecs of the HTTP protocol (PyAV / soundfile); no model code.

PCM inside the server is float32 in [-1, 1], mono [samples] (speech) or [samples, channels] (Stable Audio's
stereo). Output formats follow OpenAI's names:
wav, pcm (raw s16le; `pcm16` in chat), flac, mp3, opus (Ogg), aac (ADTS).
"""
from __future__ import annotations

import io
import itertools
import struct

import av
import numpy as np
import soundfile as sf

CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "pcm16": "audio/pcm", "flac": "audio/flac",
                 "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac"}
# Formats whose byte stream can be sent chunk by chunk as produced (one header at most).
STREAMABLE = ("wav", "pcm", "pcm16")
# format -> (container, encoder, the sample rates it encodes): mp3 and aac keep the audio's rate (24 kHz speech,
# 44.1 kHz Stable Audio), Ogg Opus runs at 48 kHz
_MP3_AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)
_AV_FORMATS = {"mp3": ("mp3", "libmp3lame", _MP3_AAC_RATES), "opus": ("ogg", "libopus", (48000,)),
               "aac": ("adts", "aac", _MP3_AAC_RATES)}


class AudioDecodeError(ValueError):
    """The bytes are not audio that PyAV can decode."""


class AudioTooLong(ValueError):
    """The audio lasts longer than the caller's limit (decoding stopped there)."""

    def __init__(self, max_seconds: float):
        super().__init__(f"audio is longer than {max_seconds:g} s")
        self.max_seconds = max_seconds


def pcm16(pcm: np.ndarray) -> bytes:
    """float32 [samples] (or [samples, channels]: interleaved) in [-1, 1] -> little-endian signed 16-bit bytes
    (clipped)."""
    return (np.clip(np.asarray(pcm, dtype=np.float32), -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def streaming_wav_header(sample_rate: int, channels: int = 1) -> bytes:
    """RIFF/WAVE header for 16-bit PCM of unknown length (size fields 0xFFFFFFFF), as streamed WAV uses."""
    byte_rate = sample_rate * channels * 2
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, byte_rate, channels * 2, 16) +
            b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode(pcm: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Whole-file encoding of float32 PCM at sample_rate Hz: mono [samples], or [samples, channels] (1 or 2
    channels: stereo for Stable Audio).

    wav/flac: 16-bit at sample_rate (soundfile); pcm/pcm16: raw s16le (channels interleaved); mp3/aac: PyAV at
    sample_rate (48 kHz for a rate they do not take); opus: PyAV at 48 kHz (resampled by libswresample). No samples
    (an input with nothing to say): raw PCM is empty and WAV a 44-byte file; the other formats get 10 ms of silence
    (FLAC of no frames was 0 bytes, not a file, and PyAV's encoders raised MemoryError). Raises ValueError for an
    unknown format or more than 2 channels.
    """
    pcm = np.asarray(pcm, dtype=np.float32)
    pcm = pcm.reshape(-1, 1) if pcm.ndim < 2 else pcm
    if pcm.ndim != 2 or pcm.shape[1] not in (1, 2):
        raise ValueError(f"PCM must be [samples] or [samples, 1 or 2 channels], got {list(pcm.shape)}")
    if fmt in ("pcm", "pcm16"):
        return pcm16(pcm)
    if pcm.shape[0] == 0 and fmt != "wav":
        pcm = np.zeros((max(1, sample_rate // 100), pcm.shape[1]), np.float32)
    if fmt in ("wav", "flac"):
        buf = io.BytesIO()
        sf.write(buf, pcm, sample_rate, format=fmt.upper(), subtype="PCM_16")
        return buf.getvalue()
    if fmt not in _AV_FORMATS:
        raise ValueError(f"unsupported audio format {fmt!r}; use one of {', '.join(CONTENT_TYPES)}")
    container, codec, rates = _AV_FORMATS[fmt]
    rate = sample_rate if sample_rate in rates else 48000
    layout = "mono" if pcm.shape[1] == 1 else "stereo"
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = layout
        resampler = av.AudioResampler(format=stream.format, layout=layout, rate=rate)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm).reshape(1, -1), format="flt", layout=layout)
        frame.sample_rate = sample_rate
        for resampled in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(resampled):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def decode(data: bytes, sample_rate: int = 16000, max_seconds: float | None = None) -> np.ndarray:
    """Any container/codec PyAV reads (wav, mp3, flac, ogg, webm, m4a, ...) -> float32 mono PCM
    resampled to sample_rate Hz. The samples are faster-whisper's `decode_audio` ones (libswresample to
    16-bit, then / 32768), so Whisper hears a file as faster-whisper (and its servers) would: a float
    resampling differs by half a 16-bit step and can change words. Raises AudioDecodeError if nothing
    decodable is found or a sample is not finite, and
    AudioTooLong as soon as more than `max_seconds` are decoded (the rest is not decoded)."""
    if not data:
        raise AudioDecodeError("audio is empty")
    limit = None if max_seconds is None else int(max_seconds * sample_rate)
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.audio:
                raise AudioDecodeError("no audio stream found")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=sample_rate)
            chunks, total = [], 0
            for frame in itertools.chain(container.decode(audio=0), [None]):   # None flushes the resampler
                if frame is not None and frame.format.name.startswith(("flt", "dbl")) \
                        and not np.isfinite(frame.to_ndarray()).all():  # float WAV/FLAC can carry them
                    raise AudioDecodeError("audio holds NaN or infinite samples")
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if limit is not None and total > limit:
                    raise AudioTooLong(max_seconds)
    except (AudioDecodeError, AudioTooLong):
        raise
    except (av.FFmpegError, ValueError, IndexError, EOFError, OSError, UnicodeDecodeError, OverflowError) as exc:
        raise AudioDecodeError(f"could not decode audio: {exc}") from exc
    if not chunks:
        raise AudioDecodeError("audio contains no samples")
    return np.concatenate(chunks).astype(np.float32) / 32768.0
