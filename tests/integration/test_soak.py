"""Soak: every pipeline at moderate load for OMNI_SOAK_S seconds (default 30 min), with cancelled streams
and bad requests mixed in; the server's resident memory (launcher, tritonserver, every stub) must grow
by less than 5 % between the end of the warm-up and the end, no request may get a 5xx, and every stage
is idle and healthy afterwards. Marked slow: not part of the default run (`./scripts/test -m slow`).
Writes its figures to soak.json in the test's temporary directory and prints them."""
from __future__ import annotations

import io
import json
import os
import random
import threading
import time

import httpx
import numpy as np
import psutil
import pytest
import soundfile as sf

from tests.harness import inflight, settle_time, start_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOAK_S = float(os.environ.get("OMNI_SOAK_S", "1800"))
CLIENTS = int(os.environ.get("OMNI_SOAK_CLIENTS", "2"))   # moderate load on 2 cores
MAX_GROWTH = 0.05


def _rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class _Mix:
    """One client's request mix over every pipeline; counts outcomes by status."""

    def __init__(self, base_url: str, seed: int):
        self.base, self.random = base_url, random.Random(seed)
        self.statuses: dict[str, int] = {}
        self.client = httpx.Client(timeout=300)
        wav = io.BytesIO()
        tone = 0.2 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
        sf.write(wav, tone.astype(np.float32), 16000, format="WAV")
        self.wav = wav.getvalue()

    def _count(self, kind: str, status: int | str) -> None:
        key = f"{kind}:{status}"
        self.statuses[key] = self.statuses.get(key, 0) + 1

    def chat(self, model: str, **extra):
        body = {"model": model, "max_tokens": 24, "messages": [{"role": "user", "content": "Name a colour."}], **extra}
        self._count(f"chat-{model}", self.client.post(f"{self.base}/v1/chat/completions", json=body).status_code)

    def streamed_chat(self, model: str, abandon: bool, **extra):
        body = {"model": model, "max_tokens": 24, "stream": True, **extra,
                "messages": [{"role": "user", "content": "Tell me about the sea."}]}
        with self.client.stream("POST", f"{self.base}/v1/chat/completions", json=body) as response:
            status = response.status_code
            for line in response.iter_lines():
                if abandon and line.startswith("data: {"):
                    status = "abandoned"
                    break
                if line.startswith("data:") and '"error"' in line:
                    status = "error-event"
        self._count(f"stream-{model}", status)

    def speech(self):
        response = self.client.post(f"{self.base}/v1/audio/speech", json={
            "model": "tts", "input": "The soak test keeps talking.", "voice": "alloy", "response_format": "wav"})
        self._count("speech", response.status_code)

    def transcription(self):
        response = self.client.post(f"{self.base}/v1/audio/transcriptions", data={"model": "whisper-1"},
                                    files={"file": ("tone.wav", self.wav, "audio/wav")})
        self._count("transcription", response.status_code)

    def bad(self):
        response = self.client.post(f"{self.base}/v1/chat/completions", json={
            "model": "voice", "messages": [{"role": "user", "content": "x"}], "temperature": 7})
        self._count("bad", response.status_code)

    def step(self):
        spoken = {"audio": {"voice": "alloy", "format": "pcm16"}}
        action = self.random.choice([
            lambda: self.chat("voice", modalities=["text"]),
            lambda: self.streamed_chat("voice", abandon=False, **spoken),
            lambda: self.streamed_chat("voice", abandon=True, **spoken),
            lambda: self.chat("qwen3_omni", audio={"voice": "ethan", "format": "wav"}, talker_max_frames=24),
            lambda: self.streamed_chat("qwen3_omni", abandon=self.random.random() < 0.5, talker_max_frames=24,
                                       audio={"voice": "ethan", "format": "pcm16"}),
            self.speech, self.transcription, self.bad,
        ])
        try:
            action()
        except httpx.HTTPError as exc:
            self._count("transport", type(exc).__name__)


def test_soak_memory_stays_flat_and_nothing_fails(tmp_path):
    server = start_server(tmp_path, "--pipelines", "voice,tts,asr,qwen3_omni")
    try:
        stop, mixes = threading.Event(), [_Mix(server.base_url, seed) for seed in range(CLIENTS)]

        def run(mix: _Mix):
            while not stop.is_set():
                mix.step()

        threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in mixes]
        started = time.monotonic()
        [t.start() for t in threads]
        warmup_s = max(60.0, 0.1 * SOAK_S)
        time.sleep(warmup_s)
        baseline = _rss(server.process.pid)
        samples = [(round(time.monotonic() - started), baseline)]
        while time.monotonic() - started < SOAK_S:
            time.sleep(min(60.0, SOAK_S / 10))
            samples.append((round(time.monotonic() - started), _rss(server.process.pid)))
        stop.set()
        [t.join(300) for t in threads]
        settled = settle_time(server.metrics_url, time.monotonic(), timeout_s=60)
        final = samples[-1][1]
        statuses: dict[str, int] = {}
        for mix in mixes:
            for key, count in mix.statuses.items():
                statuses[key] = statuses.get(key, 0) + count
        figures = {"seconds": SOAK_S, "clients": CLIENTS, "warmup_s": warmup_s, "baseline_rss_mib": baseline / 2**20,
                   "final_rss_mib": final / 2**20, "growth": final / baseline - 1,
                   "samples_mib": [(t, round(r / 2**20, 1)) for t, r in samples], "statuses": statuses,
                   "requests": sum(statuses.values()), "settled_after_s": settled}
        (tmp_path / "soak.json").write_text(json.dumps(figures, indent=2))
        print(json.dumps(figures, indent=2))
        server_errors = {k: v for k, v in statuses.items()
                         if k.split(":", 1)[1].startswith("5") or k.endswith("error-event") or k.startswith("transport")}
        assert not server_errors, server_errors
        assert statuses.get("bad:400", 0) > 0 and figures["requests"] > 20
        assert settled is not None, inflight(server.metrics_url)
        assert httpx.get(f"{server.base_url}/health").status_code == 200
        assert figures["growth"] < MAX_GROWTH, figures
    finally:
        server.stop()
