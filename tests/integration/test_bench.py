"""scripts/bench and perf_analyzer_configs/run.sh against the real server (tritonserver + frontend).

The mock pipelines stream `repeat` text deltas, each followed by a 100-sample audio packet at 24 kHz
when the request names a voice, so every metric has a known shape. Speech and transcription need the
real Kokoro / Whisper models (their server starts in ~10 s).
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from omni_bench.cli import main
from omni_bench.metrics import request_metrics
from omni_bench.records import Chunk, RequestRecord
from tests.harness import ROOT

pytestmark = pytest.mark.integration
REPEAT = 8
LEVEL_KEYS = {"workload", "model", "max_concurrency", "request_rate", "summary", "requests"}
RECORD_KEYS = {"index", "prompt", "send_time", "chunks", "text", "completion_tokens", "audio_samples", "sample_rate",
               "input_audio_s", "images", "video_frames", "error", "ok", "metrics"}
METRIC_KEYS = {"ttft_s", "ttfp_s", "e2e_s", "itl_s", "tpot_s", "audio_duration_s", "rtf", "completion_tokens",
               "image_latency_s", "frames_per_second"}


def _bench(tmp_path, server, *args: str) -> tuple[int, dict]:
    out = tmp_path / "result.json"
    code = main(["--base-url", server.base_url, "--result-json", str(out), "--num-warmups", "1", *args])
    return code, json.loads(out.read_text())


def _record(data: dict) -> RequestRecord:
    fields = {k: v for k, v in data.items() if k not in ("ok", "metrics", "chunks")}
    return RequestRecord(**fields, chunks=[Chunk(**c) for c in data["chunks"]])


def _in_flight_peak(requests: list[dict]) -> int:
    """Most requests in flight at once, from send times and end-to-end latencies."""
    starts = [(r["send_time"], 1) for r in requests]
    ends = [(r["send_time"] + r["metrics"]["e2e_s"], -1) for r in requests]
    edges = sorted(starts + ends)  # at equal times an end (-1) sorts before a start
    return max(np.cumsum([d for _, d in edges]))


def test_chat_audio_sweep_json_is_complete_and_consistent(mock_server, tmp_path):
    code, result = _bench(tmp_path, mock_server, "--workload", "chat-audio", "--model", "mock", "--voice", "x",
                          "--num-prompts", "4", "--max-concurrency", "1", "2",
                          "--extra-body", json.dumps({"repeat": REPEAT, "delay_ms": 5}))
    assert code == 0
    assert result["config"]["max_concurrency"] == [1, 2] and result["config"]["request_rate"] == "inf"
    assert [level["max_concurrency"] for level in result["levels"]] == [1, 2]
    for level in result["levels"]:
        assert set(level) == LEVEL_KEYS
        summary, requests = level["summary"], level["requests"]
        assert (summary["requests"], summary["completed"], summary["failed"]) == (4, 4, 0)
        assert [r["index"] for r in requests] == [0, 1, 2, 3]
        assert _in_flight_peak(requests) == level["max_concurrency"]
        for r in requests:
            assert set(r) == RECORD_KEYS and set(r["metrics"]) == METRIC_KEYS and r["ok"]
            m = r["metrics"]
            kinds = [c["kind"] for c in r["chunks"]]
            assert kinds.count("text") == REPEAT and kinds.count("audio") == REPEAT
            assert r["text"] == "".join(f"tok{i}" for i in range(REPEAT)) and r["completion_tokens"] == REPEAT
            assert r["audio_samples"] == REPEAT * 100 == sum(c["samples"] for c in r["chunks"])
            assert all(c["size"] == 200 for c in r["chunks"] if c["kind"] == "audio")  # PCM16: 2 bytes/sample
            assert r["sample_rate"] == 24000 and m["audio_duration_s"] == pytest.approx(REPEAT * 100 / 24000)
            assert 0 < m["ttft_s"] <= m["ttfp_s"] <= m["e2e_s"] == r["chunks"][-1]["t"]
            assert m["rtf"] == pytest.approx(m["e2e_s"] / m["audio_duration_s"])
            text_times = [c["t"] for c in r["chunks"] if c["kind"] == "text"]
            assert m["itl_s"] == pytest.approx(np.diff(text_times).tolist()) and len(m["itl_s"]) == REPEAT - 1
            # deltas are sent 5 ms apart: the stream cannot end sooner (their arrival gaps can shrink on a loaded
            # host, where several deltas come in one read, so the gaps' sum is no bound)
            assert m["e2e_s"] >= (REPEAT - 1) * 0.005 and sum(m["itl_s"]) > 0
            assert m["tpot_s"] == pytest.approx((m["e2e_s"] - m["ttft_s"]) / (REPEAT - 1))
            assert request_metrics(_record(r)) == m  # the JSON records alone reproduce the metrics
        metrics, throughput = summary["metrics"], summary["throughput"]
        assert metrics["itl_s"]["n"] == 4 * (REPEAT - 1) and metrics["ttfp_s"]["n"] == 4
        ttfts = [r["metrics"]["ttft_s"] for r in requests]
        assert metrics["ttft_s"]["median"] == pytest.approx(float(np.median(ttfts)))
        assert metrics["ttft_s"]["mean"] <= metrics["ttft_s"]["p99"] <= max(ttfts)
        assert throughput["total_completion_tokens"] == 4 * REPEAT
        assert throughput["total_audio_s"] == pytest.approx(4 * REPEAT * 100 / 24000)
        assert throughput["request_throughput"] == pytest.approx(4 / summary["duration_s"])


def test_text_chat_through_the_script_with_poisson_arrivals(mock_server, tmp_path):
    out = tmp_path / "chat.json"
    run = subprocess.run([str(ROOT / "scripts" / "bench"), "--base-url", mock_server.base_url, "--model", "relay",
                          "--num-prompts", "4", "--max-concurrency", "0", "--request-rate", "20", "--seed", "3",
                          "--extra-body", '{"repeat": 4}', "--result-json", str(out), "--plot", str(tmp_path / "p.png")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "ttft (ms)" in run.stdout and "ttfp" not in run.stdout
    level = json.loads(out.read_text())["levels"][0]
    assert level["max_concurrency"] is None and level["request_rate"] == 20.0
    assert set(level["summary"]["metrics"]) == {"ttft_s", "e2e_s", "itl_s", "tpot_s", "completion_tokens"}
    sends = [r["send_time"] for r in level["requests"]]
    gaps = np.random.default_rng(3).exponential(1 / 20, 4)[:3]
    assert all(np.diff(sends) >= gaps - 0.002)  # released on the seeded Poisson schedule, not earlier
    assert all(r["text"] == "tok0tok1tok2tok3" for r in level["requests"])
    assert ("plot written" in run.stdout) or ("matplotlib is not installed" in run.stdout)


def test_failed_requests_are_counted_and_fail_the_run(mock_server, tmp_path):
    code, result = _bench(tmp_path, mock_server, "--model", "mock", "--num-prompts", "3", "--extra-body",
                          '{"reject": true}')
    summary = result["levels"][0]["summary"]
    assert code == 1 and (summary["requests"], summary["completed"], summary["failed"]) == (3, 0, 3)
    assert summary["metrics"] == {}
    assert all("mock rejection" in r["error"] and not r["ok"] for r in result["levels"][0]["requests"])


def test_perf_analyzer_script_streams_against_mock_stream(mock_server, tmp_path):
    """Fetches the tritonclient 2.41.0 wheel on first use (~12 MB, cached in ~/.cache/omni-triton/)."""
    export = tmp_path / "export.json"
    run = subprocess.run([str(ROOT / "perf_analyzer_configs" / "run.sh"), "mock_stream", "--url", mock_server.grpc_url,
                          "--concurrency", "1:2:1", "--export", str(export), "--", "--measurement-interval", "500",
                          # what is tested is the script and the export, not a stable latency: a loaded clean-clone
                          # run failed "Failed to obtain stable measurement within 10 measurement windows"
                          "--stability-percentage", "100", "--max-trials", "30"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    experiments = json.loads(export.read_text())["experiments"]
    assert [e["experiment"] for e in experiments] == [{"mode": "concurrency", "value": 1},
                                                      {"mode": "concurrency", "value": 2}]
    # mock_stream.json asks for 8 deltas with a voice: 8 text + 8 audio + done + the empty final response
    responses = {len(r["response_timestamps"]) for e in experiments for r in e["requests"]}
    assert responses == {2 * 8 + 2}
    assert all(r["response_timestamps"][0] > r["timestamp"] for e in experiments for r in e["requests"])


def test_speech_and_transcription_workloads_on_real_models(voice_server, tmp_path):
    code, speech = _bench(tmp_path, voice_server, "--workload", "speech", "--num-prompts", "2")
    assert code == 0
    for r in speech["levels"][0]["requests"]:
        m = r["metrics"]
        assert r["sample_rate"] == 24000 and r["audio_samples"] == sum(c["samples"] for c in r["chunks"]) > 12000
        assert m["ttft_s"] is None and 0 < m["ttfp_s"] <= m["e2e_s"]
        assert m["rtf"] == pytest.approx(m["e2e_s"] / (r["audio_samples"] / 24000))
    # The same server stands in as the --baseline-url peer: the alternated runs and their CPU accounting.
    code, asr = _bench(tmp_path, voice_server, "--workload", "transcription", "--num-prompts", "2",
                       "--baseline-url", voice_server.base_url, "--rounds", "1")
    assert code == 0
    peer = asr["baseline_server"]
    assert peer["url"] == voice_server.base_url and len(peer["levels"][0]["requests"]) == 2
    for usage in (asr["levels"][0]["server_usage"], peer["levels"][0]["server_usage"]):
        assert usage["cpu_s"] > 0 and usage["cpu_s_per_audio_s"] == pytest.approx(usage["cpu_s"] / usage["audio_s"])
        assert usage["health_s"]["n"] >= 1
    assert {"e2e_s", "cpu_s_per_audio_s", "health_p99_s", "request_throughput"} <= set(peer["comparison"][0])
    for r in asr["levels"][0]["requests"]:
        assert r["input_audio_s"] > 0.5 and r["audio_samples"] == 0 and r["metrics"]["ttft_s"] is None
        assert r["metrics"]["rtf"] == pytest.approx(r["metrics"]["e2e_s"] / r["input_audio_s"])
        words = r["prompt"].lower().rstrip("?.").split()
        assert sum(w in r["text"].lower() for w in words) >= len(words) // 2  # Whisper heard Kokoro
