"""Preparation of the voice pipeline's default checkpoints (from registry packages, no network)."""
import time

import pytest

from omni_backends.voice import models

pytestmark = pytest.mark.unit


def test_prepare_is_idempotent_and_fast_once_done():
    first = models.prepare_voice_models()  # converts the GGUF on a fresh machine (~20 s)
    start = time.perf_counter()
    again = models.prepare_voice_models()
    assert time.perf_counter() - start < 1.0 and again == first
    assert (first.llm / models.COMPLETE_MARKER).exists() and (first.llm / "model.safetensors").is_file()
    assert (first.whisper / "model.bin").is_file()
    assert first.kokoro == models.kokoro_files(models.model_home() / models.KOKORO_DIR_NAME)
    assert first.kokoro.onnx.stat().st_size > 80e6 and first.kokoro.vocab.is_file() and first.kokoro.voices.is_file()


def test_missing_package_names_the_pip_package():
    with pytest.raises(models.MissingModelPackage, match="pip install no-such-voice-pkg"):
        models.require_package("no_such_voice_pkg", "no-such-voice-pkg")

