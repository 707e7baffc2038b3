"""The realtime page (GET /realtime) in real headless Chromium (Debian's `chromium`, driven by playwright)
with a fake microphone that plays a WAV of the spoken question: the reply transcript must appear.
The screenshot is kept in var/test-artifacts/realtime_page.png."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import soundfile as sf

from tests.harness import ROOT
from tests.integration.test_realtime import QUESTION, RATE, speech

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "var" / "test-artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required"]


def test_page_talks_through_a_fake_microphone(voice_server, tmp_path):
    if not shutil.which(CHROMIUM):
        pytest.skip("chromium is not installed (./scripts/test installs Debian's chromium with apt when it can)")
    from playwright.sync_api import sync_playwright

    pcm = np.frombuffer(speech(voice_server, QUESTION, silence_before_s=1.0, silence_after_s=30.0), "<i2")
    microphone = tmp_path / "question.wav"
    sf.write(microphone, pcm, RATE, subtype="PCM_16")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            tmp_path / "profile", executable_path=CHROMIUM, headless=True,
            args=FLAGS + [f"--use-file-for-fake-audio-capture={microphone}%noloop"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{voice_server.base_url}/realtime")
            page.click("#start")
            reply = page.wait_for_selector(".turn.assistant:not(.pending)", timeout=120_000)
            page.wait_for_timeout(300)
            page.screenshot(path=str(ARTIFACTS / "realtime_page.png"))
            heard = page.inner_text(".turn.user .text")
            answer = reply.query_selector(".text").inner_text()
            page.click("#stop")
            page.wait_for_timeout(300)  # audio sources stopped by Stop end asynchronously: they must not reopen the status
            status = page.inner_text("#status")
        finally:
            browser.close()
    print(f"\nrealtime page: user {heard!r}, assistant {answer!r}; screenshot {ARTIFACTS / 'realtime_page.png'}")
    assert "capital of france" in heard.lower() and "paris" in answer.lower()
    assert status == "stopped" and errors == []
