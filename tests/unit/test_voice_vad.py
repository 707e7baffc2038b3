"""Silero VAD stage logic (python_backends/voice/vad.py) against the silero-vad library's own wrapper."""
from __future__ import annotations

import numpy as np
import pytest

from omni_backends.errors import RequestError
from omni_backends.voice.vad import SAMPLE_RATE, WINDOW, SileroVAD, VADOptions, VADStream

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def vad():
    return SileroVAD()


@pytest.fixture(scope="module")
def speech():
    """Kokoro speaking one sentence, resampled to 16 kHz (the voice pipeline's own TTS)."""
    from omni_backends.voice.audio import resample
    from omni_backends.voice.tts import KokoroTTS

    pcm = KokoroTTS().synthesize("Hello there, this is a test of voice activity detection.")
    return resample(pcm, 24000, SAMPLE_RATE)


def _padded(speech, before_s=1.0, after_s=1.5):
    return np.concatenate([np.zeros(int(before_s * SAMPLE_RATE), np.float32), speech,
                           np.zeros(int(after_s * SAMPLE_RATE), np.float32)])


def test_batched_probabilities_equal_the_library_wrapper(vad, speech):
    """Two streams scored together (batch 2, different audio) give the probabilities that silero-vad's
    OnnxWrapper gives each stream alone."""
    import torch
    from silero_vad import load_silero_vad

    audios = [_padded(speech), _padded(speech[::-1].copy(), 0.3, 0.2)]
    streams = [VADStream(), VADStream()]
    for stream, audio in zip(streams, audios):
        stream.feed(audio)
    ours = vad.process(streams)
    for audio, (probs, _) in zip(audios, ours):
        reference = load_silero_vad(onnx=True)
        expected = [reference(torch.from_numpy(audio[i:i + WINDOW]), SAMPLE_RATE).item()
                    for i in range(0, audio.size - WINDOW + 1, WINDOW)]
        np.testing.assert_allclose(probs, expected, atol=1e-5)
        assert probs.max() > 0.9 and probs[:10].max() < 0.2


def test_chunked_feeding_matches_one_shot(vad, speech):
    audio = _padded(speech)
    whole = VADStream()
    whole.feed(audio)
    expected, expected_events = vad.process([whole])[0]
    chunked, probs, events = VADStream(), [], []
    for start in range(0, audio.size, 1600):  # 100 ms chunks, not multiples of the window
        chunked.feed(audio[start:start + 1600])
        p, e = vad.process([chunked])[0]
        probs.append(p)
        events += e
    np.testing.assert_allclose(np.concatenate(probs), expected, atol=1e-6)
    assert events == expected_events


def test_turn_events_honour_padding_and_silence(vad, speech):
    audio = _padded(speech, before_s=1.0, after_s=1.5)
    options = VADOptions(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500)
    stream = VADStream(options)
    stream.feed(audio)
    _, events = vad.process([stream])[0]
    assert [e["type"] for e in events] == ["speech_started", "speech_stopped"]
    started, stopped = events
    loud = np.flatnonzero(np.abs(audio) > 0.02)  # Kokoro's clip starts and ends with a little silence
    speech_start, speech_end = loud[0], loud[-1]
    assert abs(started["audio_start"] - (speech_start - options.prefix_samples)) < 0.15 * SAMPLE_RATE
    assert abs(stopped["audio_end"] - speech_end) < 0.25 * SAMPLE_RATE
    assert stopped["sample"] - stopped["audio_end"] >= options.silence_samples
    # a longer silence requirement than the trailing silence: speech never stops
    patient = VADStream(VADOptions(silence_duration_ms=4000))
    patient.feed(audio)
    assert [e["type"] for e in vad.process([patient])[0][1]] == ["speech_started"]
    # a threshold above every probability: no speech at all
    deaf = VADStream(VADOptions(threshold=1.0))
    deaf.feed(audio)
    assert vad.process([deaf])[0][1] == []


def test_silence_and_noise_are_not_speech(vad):
    rng = np.random.default_rng(0)
    stream = VADStream()
    stream.feed(np.concatenate([np.zeros(SAMPLE_RATE, np.float32), 0.01 * rng.standard_normal(SAMPLE_RATE).astype(np.float32)]))
    probs, events = vad.process([stream])[0]
    assert events == [] and probs.max() < 0.5 and probs.size == 2 * SAMPLE_RATE // WINDOW


@pytest.mark.parametrize("fields, param", [({"threshold": 1.5}, "threshold"), ({"threshold": "high"}, "threshold"),
                                           ({"prefix_padding_ms": -1}, "prefix_padding_ms"),
                                           ({"silence_duration_ms": 0.5}, "silence_duration_ms")])
def test_bad_options_name_the_field(fields, param):
    with pytest.raises(RequestError) as info:
        VADOptions.from_json(fields)
    assert info.value.param == param


@pytest.fixture(scope="module")
def second_speech():
    from omni_backends.voice.audio import resample
    from omni_backends.voice.tts import KokoroTTS

    return resample(KokoroTTS().synthesize("And here is the rest of what I wanted to say."), 24000, SAMPLE_RATE)


def test_pauses_inside_a_turn_are_reported_and_resumed(vad, speech, second_speech):
    """Two sentences with a short gap: with pause_duration_ms the gap is a pause (paused, then resumed when
    the second sentence starts) and the trailing silence pauses, then stops the turn; without it only
    started / stopped, at the same samples."""
    gap = np.zeros(int(0.2 * SAMPLE_RATE), np.float32)  # + Kokoro's own edge pads: ~0.6 s of silence
    audio = _padded(np.concatenate([speech, gap, second_speech]), before_s=1.0, after_s=1.5)
    options = VADOptions(silence_duration_ms=800, pause_duration_ms=200)
    stream = VADStream(options)
    stream.feed(audio)
    _, events = vad.process([stream])[0]
    assert [e["type"] for e in events] == ["speech_started", "speech_paused", "speech_resumed", "speech_paused",
                                           "speech_stopped"], events
    started, paused, resumed, last_pause, stopped = events
    first_end = np.flatnonzero(np.abs(speech) > 0.02)[-1] + SAMPLE_RATE
    second_start = np.flatnonzero(np.abs(second_speech) > 0.02)[0] + SAMPLE_RATE + speech.size + gap.size
    assert abs(paused["audio_end"] - first_end) < 0.25 * SAMPLE_RATE
    assert options.pause_samples <= paused["sample"] - paused["audio_end"] < options.pause_samples + WINDOW
    assert abs(resumed["audio_start"] - second_start) < 0.15 * SAMPLE_RATE and resumed["sample"] > paused["sample"]
    # the turn's final pause and its stop name the same start of silence
    assert last_pause["audio_end"] == stopped["audio_end"] and last_pause["sample"] < stopped["sample"]
    assert stopped["sample"] - stopped["audio_end"] >= options.silence_samples
    plain = VADStream(VADOptions(silence_duration_ms=800))
    plain.feed(audio)
    assert vad.process([plain])[0][1] == [started, stopped]
    # a pause as long as the silence window is no pause: the turn just stops
    late = VADStream(VADOptions(silence_duration_ms=800, pause_duration_ms=800))
    late.feed(audio)
    assert vad.process([late])[0][1] == [started, stopped]


def test_pause_option_is_checked():
    assert VADOptions.from_json({"pause_duration_ms": None}).pause_samples is None
    assert VADOptions.from_json({"pause_duration_ms": 150}).pause_samples == 150 * SAMPLE_RATE // 1000
    with pytest.raises(RequestError) as info:
        VADOptions.from_json({"pause_duration_ms": -5})
    assert info.value.param == "pause_duration_ms"
