"""PCM helpers shared by the voice stages (PyAV's libswresample; no torch)."""
from __future__ import annotations

import numpy as np


def resample(pcm: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Resample mono float PCM with libswresample (band-limited, via PyAV).

    pcm: float [samples] mono in [-1, 1]; src_rate, dst_rate: Hz (> 0).
    Returns float32 [round(samples * dst_rate / src_rate)] at dst_rate (the input itself when the rates match).
    """
    pcm = np.ascontiguousarray(pcm, dtype=np.float32)
    if src_rate == dst_rate or pcm.size == 0:
        return pcm
    import av

    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="flt", layout="mono")
    frame.sample_rate = src_rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=dst_rate)
    frames = resampler.resample(frame) + resampler.resample(None)
    out = np.concatenate([f.to_ndarray().reshape(-1) for f in frames]) if frames else np.zeros(0, np.float32)
    expected = round(pcm.size * dst_rate / src_rate)
    return np.pad(out, (0, max(0, expected - out.size)))[:expected]
