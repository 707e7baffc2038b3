"""English text -> Kokoro phoneme strings through the libespeak-ng bundled in `espeakng-loader` (ctypes).

espeak-ng's IPA is mapped onto the phoneme inventory Kokoro-82M was trained on (misaki's American English
set: diphthongs as single letters A/I/O/W/Y, affricates ʤ/ʧ, syllabic ᵊ, no length marks), the same way
misaki's espeak fallback maps it. Clause punctuation (, . ! ? ; :) is kept because Kokoro uses it for
prosody. No espeak-ng CLI or apt package is needed.
"""
from __future__ import annotations

import ctypes
import re
import threading
from pathlib import Path

from omni_backends.voice.models import require_package

_AUDIO_OUTPUT_SYNCHRONOUS = 0x02
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02
_PHONEMES_TIE = 0x80
_TIE = "^"
_PHONEME_MODE = _PHONEMES_IPA | _PHONEMES_TIE | (ord(_TIE) << 8)
_CLAUSE_END = re.compile(r"([,.!?;:]+)(?=\s|$)")

# espeak IPA (with "^" ties) -> Kokoro/misaki American English symbols; applied longest key first.
_ESPEAK_TO_KOKORO = sorted({
    "ʔˌn\u0329": "tᵊn", "ʔn\u0329": "tᵊn", "ʔn": "tᵊn", "ʔ": "t",
    "a^ɪ": "I", "a^ʊ": "W", "e^ɪ": "A", "e": "A", "o^ʊ": "O", "ɔ^ɪ": "Y",
    "d^ʒ": "ʤ", "t^ʃ": "ʧ", "ə^l": "ᵊl",
    "ʲo": "jo", "ʲə": "jə", "ʲ": "",
    "ɚ": "əɹ", "ɜːɹ": "ɜɹ", "ɜː": "ɜɹ", "ɪə": "iə",
    "r": "ɹ", "x": "k", "ç": "k", "ɐ": "ə", "ɬ": "l", "\u0303": "",
}.items(), key=lambda kv: -len(kv[0]))
_SYLLABIC = re.compile("(\\S)\u0329")


def espeak_to_kokoro(ipa: str) -> str:
    """Map one espeak-ng IPA string (tie character "^") to Kokoro's American English phoneme symbols."""
    for old, new in _ESPEAK_TO_KOKORO:
        ipa = ipa.replace(old, new)
    ipa = _SYLLABIC.sub("ᵊ\\1", ipa)
    return ipa.replace("ː", "").replace("o", "ɔ").replace(_TIE, "")


class EspeakPhonemizer:
    """English (en-us) grapheme-to-phoneme conversion with the bundled libespeak-ng 1.52.

    libespeak-ng keeps global state, so one process-wide instance (`EspeakPhonemizer.shared()`) serialises
    calls with a lock. Raises MissingModelPackage when espeakng-loader is missing, RuntimeError when the
    library fails to initialise.
    """

    _shared: EspeakPhonemizer | None = None
    _shared_lock = threading.Lock()

    def __init__(self, voice: str = "en-us"):
        package = require_package("espeakng_loader", "espeakng-loader")
        import espeakng_loader

        self._lib = ctypes.CDLL(espeakng_loader.get_library_path())
        self._lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self._lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int]
        data_parent = str(Path(espeakng_loader.get_data_path()).parent)
        if self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_parent.encode(), 0) < 0:
            raise RuntimeError(f"libespeak-ng from {package} failed to initialise (data: {data_parent})")
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise RuntimeError(f"libespeak-ng has no voice {voice!r}")
        self._lock = threading.Lock()

    @classmethod
    def shared(cls) -> EspeakPhonemizer:
        """The process-wide en-us instance (libespeak-ng cannot hold two configurations at once)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def clauses(self, text: str) -> list[str]:
        """Kokoro phoneme strings, one per clause, each ending with its clause punctuation if it had one.

        text: any English text (espeak expands numbers and abbreviations). Clauses end at , . ! ? ; : followed
        by whitespace or the end (so "3.5" stays one number). Clauses without speakable text are dropped.
        """
        pieces = _CLAUSE_END.split(text)  # [text, punctuation, text, punctuation, ..., text]
        out = []
        for body, punctuation in zip(pieces[::2], pieces[1::2] + [""]):
            phonemes = self._phonemes(body)
            if phonemes:
                out.append(phonemes + punctuation[-1:])
        return out

    def _phonemes(self, text: str) -> str:
        """espeak IPA of `text` (all its espeak clauses, space-joined) mapped to Kokoro symbols."""
        cursor = ctypes.c_char_p(text.encode("utf-8"))
        ipa = []
        with self._lock:
            while cursor.value:
                ipa.append(self._lib.espeak_TextToPhonemes(ctypes.byref(cursor), _CHARS_UTF8, _PHONEME_MODE) or b"")
        return espeak_to_kokoro(" ".join(part.decode("utf-8").strip() for part in ipa).strip())

    def phonemize(self, text: str) -> str:
        """Kokoro phoneme string for `text`: its clauses joined by spaces (e.g. "həlˈO, wˈɜɹld.")."""
        return " ".join(self.clauses(text))
