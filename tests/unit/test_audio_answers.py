"""An answer asked with the "audio" modality always has audio: text the voice cannot say (an emoji-only reply) is
10 ms of silence with that text as its transcript (`voice` with the real Kokoro engine; `qwen3_omni`'s turn
when its talker made no audio), as the speech WebSocket makes such a sentence."""
from __future__ import annotations

import asyncio
import importlib
import sys
import types

import numpy as np
import pytest

from omni_backends.serving.events import SILENCE_S, silence

pytestmark = pytest.mark.unit
RATE = 24000


@pytest.fixture(scope="module")
def kokoro():
    from omni_backends.voice import engines

    return engines.load(engines.KOKORO)


@pytest.fixture
def voice_model(monkeypatch):
    """omni_backends.voice.serving.voice_model imported with a stand-in for triton_python_backend_utils."""
    stub = types.ModuleType("triton_python_backend_utils")
    stub.__getattr__ = lambda name: 0
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    before = set(sys.modules)
    yield importlib.import_module("omni_backends.voice.serving.voice_model")
    for name in set(sys.modules) - before:
        if name.startswith("omni_backends.") and ".serving" in name:
            del sys.modules[name]


class _Out:
    def __init__(self):
        self.items: list[tuple[dict, np.ndarray]] = []

    async def put(self, item):
        self.items.append(item)


def _spoken(voice_model, kokoro, monkeypatch, answer: str) -> list[tuple[dict, np.ndarray]]:
    """The audio.delta events of voice's answer `answer`: its chunker (as `handle` makes it) and `_speak_chunks`,
    voice_tts being the real Kokoro engine in this process (the calls it gets are in `voice_model.tts_calls`)."""
    voice_model.tts_calls = []

    async def speak(ctx, text, voice, speed):
        voice_model.tts_calls.append(text)
        return kokoro.synthesize(text, voice=voice, speed=speed), 0

    monkeypatch.setattr(voice_model, "speak", speak)
    chunker = voice_model.SentenceChunker(keep_wordless=True)

    async def run():
        queue, out = asyncio.Queue(), _Out()
        for chunk in chunker.feed(answer) + chunker.flush() + [voice_model._END]:
            queue.put_nowait(chunk)
        await voice_model._speak_chunks(None, "jf_alpha", queue, out, {"completion_tokens": 3})
        return out.items

    return asyncio.run(run())


def test_silence_is_ten_milliseconds():
    assert SILENCE_S == 0.01 and silence(RATE).shape == (240,) and silence(RATE).dtype == np.float32
    assert not silence(RATE).any() and silence(8000).size == 80


@pytest.mark.parametrize("answer", ["👍", "🎉🎉", " 👍\n"])
def test_voice_answers_an_emoji_only_reply_with_silence_whose_transcript_is_the_text(voice_model, kokoro,
                                                                                       monkeypatch, answer):
    """An emoji-only reply has no word: the chunker dropped it, so no audio.delta came at all (the chat's
    message.audio was null, realtime's transcript empty). It is now 10 ms of silence whose transcript is the text,
    and is not sent to voice_tts (nothing to speak, as the `tts` pipeline refuses "👍")."""
    items = _spoken(voice_model, kokoro, monkeypatch, answer)
    assert [event for event, _ in items] == [{"type": "audio.delta", "sample_rate": RATE,
                                              "transcript": answer.strip(), "usage": {"completion_tokens": 3}}]
    assert items[0][1].dtype == np.float32 and items[0][1].shape == (240,) and not items[0][1].any()
    assert voice_model.tts_calls == []


def test_voice_keeps_speech_and_makes_only_the_wordless_chunk_silent(voice_model, kokoro, monkeypatch):
    """"Great job! 🎉": the speech of "Great job!" as before, then "🎉" as silence, so the transcripts add up to the
    answer (the "🎉" was left out of message.audio.transcript)."""
    items = _spoken(voice_model, kokoro, monkeypatch, "Great job! 🎉")
    assert "".join(event["transcript"] for event, _ in items) == "Great job! 🎉"
    assert [event["transcript"] for event, _ in items] == ["Great job!", " 🎉"]
    assert items[0][1].size > RATE // 4 and np.abs(items[0][1]).max() > 0.01   # real speech
    assert items[1][1].shape == (240,) and not items[1][1].any()
    assert voice_model.tts_calls == ["Great job!"]


def test_voice_makes_a_chunk_the_engine_says_nothing_of_silent(voice_model, kokoro, monkeypatch):
    """Letters Kokoro cannot read ("١٢٣", Arabic-Indic digits) are a word to the chunker, but voice_tts answers no
    samples: the chunk is the same 10 ms of silence (it was a transcript-only delta, no audio)."""
    assert kokoro.synthesize("١٢٣", voice="jf_alpha").size == 0
    items = _spoken(voice_model, kokoro, monkeypatch, "١٢٣")
    assert [(event["transcript"], audio.size, audio.any()) for event, audio in items] == [("١٢٣", 240, False)]
    assert voice_model.tts_calls == ["١٢٣"]


def test_voice_answers_no_text_with_one_silent_clip(voice_model, kokoro, monkeypatch):
    """An answer without text (max_tokens cut inside its first character) still has its audio: 10 ms, no words."""
    items = _spoken(voice_model, kokoro, monkeypatch, "")
    assert [(event["transcript"], audio.size) for event, audio in items] == [("", 240)]


def test_a_qwen3_omni_turn_whose_talker_made_no_audio_ends_with_silence():
    """qwen3_omni's talker speaks tokens (an emoji too), but a talker that ends before its first frame left the
    answer without audio (a transcript-only delta): the turn's closing delta is then 10 ms of silence; after real
    audio it stays a transcript-only delta of the unspoken text, and none when nothing is left."""
    from omni_backends.qwen3_omni.serving.turn import Turn

    turn = Turn({}, "ethan")
    turn.unspoken.append("👍")
    event, pcm = turn.last_audio(RATE)
    assert event == {"type": "audio.delta", "sample_rate": RATE, "transcript": "👍"}
    assert pcm.shape == (240,) and not pcm.any()
    assert turn.last_audio(RATE) is None
    assert Turn({}, "ethan").last_audio(RATE)[1].shape == (240,)   # no text either
    spoke = Turn({}, "ethan")
    spoke.audio_sent = True
    assert spoke.last_audio(RATE) is None
    spoke.unspoken.append(" tail")
    assert spoke.last_audio(RATE) == ({"type": "audio.delta", "sample_rate": RATE, "transcript": " tail"}, None)
