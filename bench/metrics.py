"""Metric definitions (docs/benchmarks.md, "Metrics") and their summaries.

Per request, from its chunks (times in seconds since its send):
  ttft_s           arrival of the first non-empty text delta
  ttfp_s           arrival of the first audio packet
  e2e_s            arrival of the last event (for transcription: the response; this is its latency)
  itl_s            gaps between consecutive text deltas (a list; pooled over requests in summaries)
  tpot_s           (e2e - ttft) / (completion_tokens - 1), when the request produced 2+ tokens
  audio_duration_s decoded output samples / sample rate
  rtf              e2e / audio_duration (audio out), or e2e / input_audio_s (transcription)
  image_latency_s  e2e / images received (images workload)
  frames_per_second video frames / e2e (videos workload: e2e is the time until the job is completed)
Per run (duration = first send to last completion):
  request_throughput, output_tokens_per_s, audio_seconds_per_s (output audio), input_audio_seconds_per_s
  (transcription input), images_per_s, video_frames_per_s.
"""
from __future__ import annotations

import numpy as np

from omni_bench.records import AUDIO, TEXT, RequestRecord

# Metric name -> unit shown in the table ("ms" values are stored in seconds and printed in ms).
UNITS = {"ttft_s": "ms", "ttfp_s": "ms", "e2e_s": "ms", "tpot_s": "ms", "itl_s": "ms",
         "audio_duration_s": "s", "rtf": "x", "completion_tokens": "tok", "image_latency_s": "ms",
         "frames_per_second": "fps"}
STATS = ("mean", "median", "p90", "p99")


def request_metrics(record: RequestRecord) -> dict[str, float | list[float] | None]:
    """The per-request metrics above (None where the request has no such event)."""
    text_times = [c.t for c in record.chunks if c.kind == TEXT]
    audio_times = [c.t for c in record.chunks if c.kind == AUDIO]
    e2e = record.chunks[-1].t if record.chunks else None
    ttft = text_times[0] if text_times else None
    tokens = record.completion_tokens
    duration = record.audio_samples / record.sample_rate if record.sample_rate and record.audio_samples else None
    if duration:
        rtf = e2e / duration
    elif record.input_audio_s:
        rtf = e2e / record.input_audio_s
    else:
        rtf = None
    return {
        "ttft_s": ttft,
        "ttfp_s": audio_times[0] if audio_times else None,
        "e2e_s": e2e,
        "itl_s": list(np.diff(text_times)) if len(text_times) > 1 else [],
        "tpot_s": (e2e - ttft) / (tokens - 1) if ttft is not None and tokens and tokens > 1 else None,
        "audio_duration_s": duration,
        "rtf": rtf,
        "completion_tokens": tokens,
        "image_latency_s": e2e / record.images if record.images and e2e is not None else None,
        "frames_per_second": record.video_frames / e2e if record.video_frames and e2e else None,
    }


def stats(values: list[float]) -> dict[str, float] | None:
    """n, mean, median, p90, p99 (linear interpolation) of the values; None when there are none."""
    if not values:
        return None
    array = np.asarray(values, dtype=np.float64)
    return {"n": int(array.size), "mean": float(array.mean()), "median": float(np.median(array)),
            "p90": float(np.percentile(array, 90)), "p99": float(np.percentile(array, 99))}


def summarize(records: list[RequestRecord], duration_s: float) -> dict:
    """Summary of one run: counts, throughput and `stats` of every metric over the successful requests
    (ITL pools all gaps). Metrics no request produced are left out."""
    ok = [r for r in records if r.ok]
    per_request = [request_metrics(r) for r in ok]
    summary: dict = {"requests": len(records), "completed": len(ok), "failed": len(records) - len(ok),
                     "duration_s": duration_s}
    tokens = sum(m["completion_tokens"] or 0 for m in per_request)
    audio = sum(m["audio_duration_s"] or 0.0 for m in per_request)
    heard = sum(r.input_audio_s or 0.0 for r in ok)
    summary["throughput"] = {"request_throughput": len(ok) / duration_s if duration_s else 0.0,
                             "output_tokens_per_s": tokens / duration_s if duration_s else 0.0,
                             "audio_seconds_per_s": audio / duration_s if duration_s else 0.0,
                             "input_audio_seconds_per_s": heard / duration_s if duration_s else 0.0,
                             "images_per_s": sum(r.images for r in ok) / duration_s if duration_s else 0.0,
                             "video_frames_per_s": sum(r.video_frames for r in ok) / duration_s if duration_s else 0.0,
                             "total_completion_tokens": tokens, "total_audio_s": audio}
    metrics = {}
    for name in UNITS:
        if name == "itl_s":
            values = [gap for m in per_request for gap in m["itl_s"]]
        else:
            values = [m[name] for m in per_request if m[name] is not None]
        if (found := stats(values)) is not None:
            metrics[name] = found
    summary["metrics"] = metrics
    return summary
