"""PCM helpers shared by the voice stages (PyAV's libswresample and libavfilter; no torch)."""
from __future__ import annotations

import fractions

import numpy as np

# Below this absolute amplitude (about -46 dBFS) a sample counts as silence when edges are trimmed.
SILENCE_THRESHOLD = 0.005


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


def time_stretch(pcm: np.ndarray, rate: int, factor: float) -> np.ndarray:
    """Pitch-preserving tempo change with FFmpeg's `atempo` filter (WSOLA) through PyAV.

    pcm: float [samples] mono in [-1, 1] at `rate` Hz; factor: tempo multiplier in [0.25, 100]
    (2.0 = twice as fast, about half the samples; below 0.5, atempo's least, two filters of sqrt(factor) in a row).
    Returns float32 [about samples / factor]. Raises ValueError for a factor outside [0.25, 100].
    """
    if not 0.25 <= factor <= 100:
        raise ValueError(f"time_stretch factor must be in [0.25, 100], got {factor}")
    pcm = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
    if factor == 1.0 or pcm.size == 0:
        return pcm
    import av

    graph = av.filter.Graph()
    source = graph.add_abuffer(format="flt", sample_rate=rate, layout="mono")
    steps = [factor] if factor >= 0.5 else [factor ** 0.5] * 2
    chain = [source, *(graph.add("atempo", f"{step:.6f}") for step in steps), graph.add("abuffersink")]
    for node, following in zip(chain, chain[1:]):
        node.link_to(following)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="flt", layout="mono")
    frame.sample_rate, frame.pts, frame.time_base = rate, 0, fractions.Fraction(1, rate)
    graph.push(frame)
    graph.push(None)
    out = []
    while True:
        try:
            out.append(graph.pull().to_ndarray().reshape(-1))
        except (av.BlockingIOError, av.EOFError):
            break
    return np.concatenate(out).astype(np.float32, copy=False) if out else np.zeros(0, np.float32)


def trim_edges(pcm: np.ndarray, rate: int, lead_s: float, tail_s: float,
               threshold: float = SILENCE_THRESHOLD, pad: bool = False) -> np.ndarray:
    """Shorten the silence at both ends to at most `lead_s` before the first and `tail_s` after the last
    sample whose magnitude reaches `threshold` (sound itself is never cut); with `pad`, shorter edges are
    lengthened with zeros, so both are exactly `lead_s` and `tail_s`.

    pcm: float [samples] mono; rate: Hz. Returns float32 [samples], a view of pcm unless padded
    (all-silent input: empty).
    """
    pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
    loud = np.flatnonzero(np.abs(pcm) >= threshold)
    if loud.size == 0:
        return pcm[:0]
    lead, tail = round(lead_s * rate), round(tail_s * rate)
    start, stop = int(loud[0]) - lead, int(loud[-1]) + 1 + tail
    out = pcm[max(0, start):min(pcm.size, stop)]
    if pad and (start < 0 or stop > pcm.size):
        out = np.pad(out, (max(0, -start), max(0, stop - pcm.size)))
    return out
