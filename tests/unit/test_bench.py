"""omni_bench's pure parts: metric definitions, summaries, audio packet decoding, prompt datasets."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from omni_bench.client import StreamError, decode_audio_packet, text_tokens
from omni_bench.datasets import BUILTIN, BUILTIN_PROMPTS, load_prompts
from omni_bench.metrics import request_metrics, stats, summarize
from omni_bench.records import AUDIO, OTHER, TEXT, RequestRecord
from omni_bench.report import compare
from omni_frontend.audio import pcm16, streaming_wav_header

pytestmark = pytest.mark.unit


def _record() -> RequestRecord:
    """Role chunk at 10 ms, text at 50/70/100 ms, audio (2400 samples at 24 kHz each) at 80/150 ms, [DONE] at 200 ms."""
    r = RequestRecord(0, "hi", completion_tokens=4, sample_rate=24000)
    for t, kind, samples in [(0.010, OTHER, 0), (0.050, TEXT, 0), (0.070, TEXT, 0), (0.080, AUDIO, 2400),
                             (0.100, TEXT, 0), (0.150, AUDIO, 2400), (0.200, OTHER, 0)]:
        r.add(t, kind, 3 if kind == TEXT else samples * 2, samples)
    return r


def test_request_metrics_follow_the_definitions():
    m = request_metrics(_record())
    assert m["ttft_s"] == 0.050 and m["ttfp_s"] == 0.080 and m["e2e_s"] == 0.200
    assert m["itl_s"] == pytest.approx([0.020, 0.030])
    assert m["tpot_s"] == pytest.approx((0.200 - 0.050) / 3)
    assert m["audio_duration_s"] == pytest.approx(0.2) and m["rtf"] == pytest.approx(1.0)


def test_transcription_rtf_uses_the_input_audio_and_missing_events_give_none():
    r = RequestRecord(0, "x", input_audio_s=4.0)
    r.add(0.5, OTHER, 10)  # a non-streamed reply: one body, no text deltas
    m = request_metrics(r)
    assert m["e2e_s"] == 0.5 and m["rtf"] == 0.125
    assert m["ttft_s"] is None and m["ttfp_s"] is None and m["tpot_s"] is None and m["itl_s"] == []


def test_summary_counts_failures_and_pools_inter_token_gaps():
    failed = RequestRecord(1, "x", error="HTTP 500")
    summary = summarize([_record(), _record(), failed], duration_s=0.5)
    assert (summary["requests"], summary["completed"], summary["failed"]) == (3, 2, 1)
    assert summary["metrics"]["itl_s"]["n"] == 4 and summary["metrics"]["ttft_s"]["n"] == 2
    assert summary["throughput"]["output_tokens_per_s"] == pytest.approx(8 / 0.5)
    assert summary["throughput"]["audio_seconds_per_s"] == pytest.approx(0.4 / 0.5)
    assert "ttfp_s" in summary["metrics"] and stats([]) is None


def test_stats_percentiles():
    s = stats(list(range(1, 101)))
    assert (s["n"], s["mean"], s["median"]) == (100, 50.5, 50.5)
    assert s["p90"] == pytest.approx(np.percentile(np.arange(1, 101), 90)) and s["p99"] == pytest.approx(99.01)


def test_compare_gives_ratio_and_difference_of_medians():
    served = {"metrics": {"ttft_s": {"median": 0.012}, "e2e_s": {"median": 2.0}}}
    baseline = {"metrics": {"ttft_s": {"median": 0.010}, "ttfp_s": {"median": 1.0}}}
    out = compare(served, baseline)
    assert set(out) == {"ttft_s"}
    assert out["ttft_s"]["ratio"] == pytest.approx(1.2) and out["ttft_s"]["difference"] == pytest.approx(0.002)


def test_audio_packets_raw_pcm16_and_streaming_wav():
    pcm = pcm16(np.linspace(-1, 1, 50, dtype=np.float32))
    assert decode_audio_packet(pcm) == (pcm, None)
    assert decode_audio_packet(streaming_wav_header(22050) + pcm) == (pcm, 22050)
    with pytest.raises(StreamError):
        decode_audio_packet(streaming_wav_header(16000)[:36])


def test_prompts_are_seeded_and_cycle(tmp_path):
    first = load_prompts(BUILTIN, 30, seed=1)
    assert first == load_prompts(BUILTIN, 30, seed=1) != load_prompts(BUILTIN, 30, seed=2)
    assert sorted(first[:len(BUILTIN_PROMPTS)]) == sorted(BUILTIN_PROMPTS) and first[24:] == first[:6]
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a"}) + "\n\n" + json.dumps({"prompt": "b", "id": 2}) + "\n")
    assert sorted(load_prompts(str(path), 2, seed=0)) == ["a", "b"]
    path.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="p.jsonl:1"):
        load_prompts(str(path), 1, seed=0)


def test_the_client_imports_no_model_code():
    code = ("import sys, omni_bench.cli\n"
            "heavy = [m for m in sys.modules\n"
            "         if m.split('.')[0] in ('torch', 'transformers', 'onnxruntime', 'omni_backends')]\n"
            "assert not heavy, heavy")  # only omni_bench.baseline (--baseline) may load them
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_text_tokens_prefer_the_text_split_of_usage():
    assert text_tokens({"completion_tokens": 65, "completion_tokens_details": {"text_tokens": 16, "audio_tokens": 49}}) == 16
    assert text_tokens({"completion_tokens": 65, "completion_tokens_details": {"text_tokens": 0}}) == 0
    assert text_tokens({"completion_tokens": 12, "completion_tokens_details": None}) == 12


@pytest.mark.parametrize("outputs, chunks, duration, metric, value, throughput, rate", [
    ({"images": 2}, [(0.4, "image", 1000), (0.4, "image", 1200)], 2.0, "image_latency_s", 0.2, "images_per_s", 1.0),
    ({"video_frames": 17}, [(0.1, "other", 0), (0.5, "other", 100)], 1.0, "frames_per_second", 34.0,
     "video_frames_per_s", 17.0),
])
def test_image_and_video_metrics(outputs, chunks, duration, metric, value, throughput, rate):
    r = RequestRecord(0, "a cat", **outputs)
    for chunk in chunks:
        r.add(*chunk)
    assert request_metrics(r)[metric] == pytest.approx(value)
    summary = summarize([r, RequestRecord(1, "x", error="boom")], duration)
    assert summary["throughput"][throughput] == pytest.approx(rate)
    assert summary["metrics"][metric]["median"] == pytest.approx(value)


def test_peer_usage_and_comparison_ratios():
    from omni_bench import peer

    served, other = RequestRecord(0, "a", input_audio_s=4.0), RequestRecord(0, "a", input_audio_s=4.0)
    served.add(0.5, OTHER)
    other.add(1.0, OTHER)
    levels = []
    for record, cpu in ((served, 0.2), (other, 0.4)):
        level = {"summary": summarize([record, record], 2.0)}
        level["server_usage"] = peer.usage([record, record], cpu, [0.01, 0.02], "transcription")
        levels.append(level)
    assert levels[0]["server_usage"]["cpu_s_per_audio_s"] == pytest.approx(0.2 / 8.0)
    found = peer.comparison(*levels)
    assert found["cpu_s_per_audio_s"]["ratio"] == pytest.approx(0.5)
    assert found["e2e_s"] == {"served": 0.5, "baseline": 1.0, "ratio": 0.5}
    assert found["input_audio_seconds_per_s"]["ratio"] == pytest.approx(1.0)
    assert peer.usage([served], None, [], "transcription")["cpu_s_per_audio_s"] is None
