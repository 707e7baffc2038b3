"""The speech engines of the voice_tts stage and their voices, chosen by the stage parameter `engine`.

    kokoro  Kokoro-82M int8 (omni_backends.voice.tts.KokoroTTS), the default: 5 voices (jf_alpha, ...)
    piper   Piper with the en_US joe voice (omni_backends.voice.piper_tts.PiperTTS), opt-in: voice "joe";
            ~8x less CPU per audio second; its licence terms are uncertain (docs/pipelines.md)

`./scripts/serve --tts-engine piper` sets the parameter in a run copy of the repository. The orchestrators
that call voice_tts (`voice`, `tts`) list and check voices for the engine that stage runs: they read its
`engine` from the voice_tts config.pbtxt beside their own model folder (`stage_engine`), so the one
parameter decides both. Nothing here loads a model until `load`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from omni_backends.voice import tts

KOKORO, PIPER = "kokoro", "piper"
ENGINES = (KOKORO, PIPER)
DEFAULT_ENGINE = KOKORO
TTS_STAGE = "voice_tts"
_COMMENT = re.compile(r"#[^\n]*")
_ENGINE_PARAMETER = re.compile(r'key:\s*"engine"\s*value\s*\{\s*string_value:\s*"([^"]*)"')


@dataclass(frozen=True)
class Voices:
    """The voices a request may name for an engine: `names`, the `default` and OpenAI-name `aliases`."""

    names: tuple[str, ...]
    default: str
    aliases: Mapping[str, str]

    def resolve(self, voice: str | None) -> str:
        """The voice name `voice` speaks with (None: the default); RequestError (param "voice") if unknown."""
        return tts.resolve_voice(voice, self.names, self.default, self.aliases)


def check_engine(name: str | None) -> str:
    """`name` (None or "": DEFAULT_ENGINE) if it is one of ENGINES; else ValueError naming them."""
    name = name or DEFAULT_ENGINE
    if name not in ENGINES:
        raise ValueError(f"unknown TTS engine {name!r}; known: {', '.join(ENGINES)}")
    return name


def voices(engine: str) -> Voices:
    """The voices of `engine` (see check_engine), read from the model packages without loading a model.
    Raises MissingModelPackage when the engine's package is missing."""
    if check_engine(engine) == PIPER:
        from omni_backends.voice import piper_tts

        return Voices((piper_tts.VOICE,), piper_tts.VOICE, piper_tts.PIPER_OPENAI_VOICES)
    return Voices(tts.voice_names(), tts.DEFAULT_VOICE, tts.OPENAI_VOICES)


def load(engine: str, kokoro_dir: Path | None = None, threads: int | None = None) -> tts.SpeechEngine:
    """A loaded engine: KokoroTTS from `kokoro_dir` (default: prepared in the model home) or PiperTTS, on
    `threads` onnxruntime threads (None: `tts.session_options`' default). Raises ValueError for an unknown
    engine, MissingModelPackage when its package is missing."""
    if check_engine(engine) == PIPER:
        from omni_backends.voice.piper_tts import PiperTTS

        return PiperTTS(intra_op_num_threads=threads)
    return tts.KokoroTTS(tts.kokoro_files(kokoro_dir) if kokoro_dir else None, intra_op_num_threads=threads)


def stage_engine(model_dir: str | Path) -> str:
    """The `engine` parameter of the voice_tts model beside `model_dir` (a Triton model folder, as the Python
    backend's `args["model_repository"]` names it): DEFAULT_ENGINE when the config does not set it.
    Raises FileNotFoundError when there is no voice_tts config beside it, ValueError for an unknown engine."""
    config = Path(model_dir).parent / TTS_STAGE / "config.pbtxt"
    if not config.is_file():
        raise FileNotFoundError(f"{config} not found: the {TTS_STAGE} model must sit in the same repository")
    match = _ENGINE_PARAMETER.search(_COMMENT.sub("", config.read_text(encoding="utf-8")))
    return check_engine(match.group(1) if match else None)
