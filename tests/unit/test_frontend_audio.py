"""Audio codecs of the HTTP protocol: every output format decodes back to the same signal."""
import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf

from omni_frontend import audio

pytestmark = pytest.mark.unit
RATE = 24000


@pytest.fixture(scope="module")
def tone():
    t = np.arange(RATE) / RATE  # 1 s, 440 Hz at 0.3 amplitude
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac"])
def test_encoded_formats_decode_back(tone, fmt):
    data = audio.encode(tone, RATE, fmt)
    decoded = audio.decode(data, 16000)
    # Length within codec padding (aac/mp3 add priming frames), amplitude preserved.
    assert abs(decoded.size - 16000) <= 1100
    assert 0.25 < float(np.abs(decoded).max()) < 0.5


def test_wav_and_flac_are_lossless_at_16_bit(tone):
    for fmt in ("wav", "flac"):
        pcm, rate = sf.read(io.BytesIO(audio.encode(tone, RATE, fmt)), dtype="float32")
        assert rate == RATE and pcm.shape == tone.shape
        np.testing.assert_allclose(pcm, tone, atol=1 / 32767)


@pytest.mark.parametrize("fmt", ["wav", "flac", "pcm", "mp3", "opus", "aac"])
def test_stereo_keeps_its_two_channels(tone, fmt):
    """[samples, 2] (Stable Audio's stereo): left the tone, right its negation; each format keeps both channels
    (PCM interleaved L, R)."""
    stereo = np.stack([tone, -tone], axis=1)
    data = audio.encode(stereo, RATE, fmt)
    if fmt == "pcm":
        samples = np.frombuffer(data, "<i2").reshape(-1, 2)
        assert np.array_equal(samples[:, 0], np.frombuffer(audio.pcm16(tone), "<i2"))
        assert np.array_equal(samples[:, 1], np.frombuffer(audio.pcm16(-tone), "<i2"))
        return
    if fmt in ("wav", "flac"):
        pcm, rate = sf.read(io.BytesIO(data), dtype="float32")
        assert rate == RATE and pcm.shape == stereo.shape
        np.testing.assert_allclose(pcm, stereo, atol=1 / 32767)
        return
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.audio[0].channels == 2
        frames = np.concatenate([f.to_ndarray().reshape(-1, 2) if f.format.is_packed else f.to_ndarray().T
                                 for f in container.decode(audio=0)])
    assert 0.25 < float(np.abs(frames[:, 0]).max()) < 0.5
    assert np.corrcoef(frames[2000:20000, 0], frames[2000:20000, 1])[0, 1] < -0.9   # the channels stay apart


def test_more_than_two_channels_is_refused():
    with pytest.raises(ValueError, match="channels"):
        audio.encode(np.zeros((10, 3), np.float32), RATE, "wav")


def test_pcm16_is_clipped_little_endian():
    data = audio.pcm16(np.array([0.0, 1.0, -1.0, 2.0], dtype=np.float32))
    assert struct.unpack("<4h", data) == (0, 32767, -32767, 32767)


def test_streaming_wav_header_then_chunks_is_a_valid_file(tone):
    data = audio.streaming_wav_header(RATE) + audio.pcm16(tone[:1000]) + audio.pcm16(tone[1000:])
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    np.testing.assert_allclose(audio.decode(data, RATE), tone, atol=2 / 32767)


@pytest.mark.parametrize("data", [b"", b"definitely not audio" * 20])
def test_undecodable_input_raises(data):
    with pytest.raises(audio.AudioDecodeError):
        audio.decode(data)


def test_unknown_output_format():
    with pytest.raises(ValueError, match="unsupported audio format"):
        audio.encode(np.zeros(10, np.float32), RATE, "ogg-vorbis")


def test_non_finite_samples_are_not_audio():
    buf = io.BytesIO()
    sf.write(buf, np.array([0.1, np.nan, 0.2] * 100, np.float32), 16000, format="WAV", subtype="FLOAT")
    with pytest.raises(audio.AudioDecodeError, match="NaN"):
        audio.decode(buf.getvalue(), 16000)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "float44k"])
def test_decoded_samples_are_faster_whispers(tone, fmt):
    """The samples Whisper gets are faster-whisper's decode_audio ones, bit for bit (what its servers hear)."""
    from faster_whisper import decode_audio

    if fmt == "float44k":
        buf = io.BytesIO()
        sf.write(buf, np.random.default_rng(0).uniform(-0.5, 0.5, 44100).astype(np.float32), 44100,
                 format="WAV", subtype="FLOAT")
        data = buf.getvalue()
    else:
        data = audio.encode(tone, RATE, fmt)
    ours, theirs = audio.decode(data, 16000), decode_audio(io.BytesIO(data))
    assert ours.dtype == np.float32 and np.array_equal(ours, theirs)


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus", "aac"])
def test_no_samples_is_still_a_decodable_file(fmt):
    """An input with nothing to say (Markdown that strips to nothing): FLAC was 0 bytes and PyAV's encoders raised
    MemoryError (a 500, and a dead /v1/audio/speech/stream session). Now 10 ms of silence in a real file."""
    import av

    data = audio.encode(np.zeros(0, np.float32), 24000, fmt)
    with av.open(io.BytesIO(data)) as container:
        samples = [f.to_ndarray() for f in container.decode(audio=0)]
    assert samples and 0 < sum(s.shape[-1] for s in samples) <= 2048 and max(np.abs(s).max() for s in samples) < 1e-3
    assert audio.encode(np.zeros(0, np.float32), 24000, "pcm") == b"" and len(audio.encode(np.zeros(0), 24000, "wav")) == 44


@pytest.mark.parametrize("rate", [24000, 44100])
def test_mp3_and_aac_keep_the_audio_rate_and_opus_is_48k(tone, rate):
    """mp3 and aac were resampled to 48 kHz whatever the audio's rate (Stable Audio's 44.1 kHz music came back at
    48 kHz, an extra lossy resampling); both take 24 and 44.1 kHz as they are. Ogg Opus runs at 48 kHz."""
    import av

    for fmt, expected in (("mp3", rate), ("aac", rate), ("opus", 48000)):
        with av.open(io.BytesIO(audio.encode(tone, rate, fmt))) as container:
            assert container.streams.audio[0].rate == expected, fmt
