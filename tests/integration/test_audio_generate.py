"""The `stable_audio` text-to-audio pipeline and POST /v1/audio/generate end to end: launcher -> tritonserver
(stable_audio_text_encoder, step-batched stable_audio_dit, stable_audio_vae, stable_audio) -> frontend, driven
with httpx and tritonclient; audio compared with diffusers' own StableAudioPipeline on the same tiny checkpoint
(same prompt, seconds, seed, steps, guidance)."""
from __future__ import annotations

import io

import av
import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from omni_backends.paths import model_home
from omni_backends.stable_audio import loading
from omni_backends.stable_audio.serving.protocol import TINY
from omni_frontend import audio as audio_codec
from tests.harness import batched_finals, metric_value, overlapping_streams, wait_for

pytestmark = pytest.mark.integration
STAGES = ("stable_audio", "stable_audio_text_encoder", "stable_audio_dit", "stable_audio_vae")
RATE = 44100   # the tiny checkpoint's VAE sampling_rate, as Stable Audio Open's
LONGEST = 256 * 128 / RATE   # its DiT's sample_size x the VAE's hop: 0.743 s


@pytest.fixture(scope="module")
def reference(audio_server):
    """diffusers' StableAudioPipeline on the tiny checkpoint -> float32 [samples, channels]."""
    pipe = loading.reference_pipeline(model_home() / TINY)

    def audio(prompt, *, length, steps, seed, guidance_scale, negative_prompt=None, start=0.0):
        with torch.no_grad():
            out = pipe(prompt, negative_prompt=negative_prompt, audio_start_in_s=start, audio_end_in_s=start + length,
                       num_inference_steps=steps, guidance_scale=guidance_scale,
                       generator=torch.Generator().manual_seed(seed), output_type="np").audios[0]
        return np.ascontiguousarray(out.T)
    return audio


def _generate(server, timeout=120, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/audio/generate", json=body, timeout=timeout)


def _inflight_zero(server) -> bool:
    return all(metric_value(server.metrics_url, "omni_inflight_requests", model=m) == 0 for m in STAGES)


def test_wav_is_diffusers_audio_and_formats_carry_it(audio_server, reference):
    """Each format's answer is byte for byte the frontend codec's encoding of diffusers' float audio (16-bit WAV,
    FLAC and PCM: 44.1 kHz stereo, 0.5 s -> int(0.5 * 44100) frames); MP3 the same duration in stereo."""
    body = {"model": "stable_audio", "input": "a dog barking in the rain", "audio_length": 0.5,
            "num_inference_steps": 4, "guidance_scale": 7.0, "seed": 7}
    response = _generate(audio_server, **body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav" and response.headers["x-seed"] == "7"
    expected = reference("a dog barking in the rain", length=0.5, steps=4, seed=7, guidance_scale=7.0)
    assert expected.shape == (int(0.5 * RATE), 2) and np.sqrt((expected ** 2).mean()) > 0.01   # not silence
    assert response.content == audio_codec.encode(expected, RATE, "wav")
    samples, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == RATE and samples.shape == (22050, 2)
    flac = _generate(audio_server, **body, response_format="flac")
    assert flac.headers["content-type"] == "audio/flac"
    assert flac.content == audio_codec.encode(expected, RATE, "flac")   # libsndfile rounds FLAC unlike WAV
    assert sf.read(io.BytesIO(flac.content))[0].shape == (22050, 2)
    pcm = _generate(audio_server, **body, response_format="pcm")
    assert pcm.content == audio_codec.encode(expected, RATE, "pcm") and len(pcm.content) == 22050 * 2 * 2
    for fmt, content_type in (("mp3", "audio/mpeg"), ("aac", "audio/aac")):   # at the model's 44.1 kHz (was 48 kHz)
        encoded = _generate(audio_server, **body, response_format=fmt)
        assert encoded.headers["content-type"] == content_type
        with av.open(io.BytesIO(encoded.content)) as container:
            stream = container.streams.audio[0]
            decoded = sum(frame.samples for frame in container.decode(audio=0))
            assert (stream.channels, stream.rate) == (2, RATE) and abs(decoded / RATE - 0.5) < 0.06, (fmt, decoded)


def test_prompt_alias_negative_prompt_and_a_clip_start(audio_server, reference):
    """`prompt` names the input too; a negative prompt and audio_start reach the pipeline as diffusers' own
    negative_prompt / audio_start_in_s (the clip [0.2, 0.5) s of the denoised waveform)."""
    response = _generate(audio_server, prompt="waves crashing on a beach", negative_prompt="low quality",
                         audio_start=0.2, audio_length=0.3, num_inference_steps=3, guidance_scale=3.0, seed=11,
                         response_format="pcm")
    assert response.status_code == 200, response.text
    expected = reference("waves crashing on a beach", negative_prompt="low quality", start=0.2, length=0.3, steps=3,
                         seed=11, guidance_scale=3.0)
    assert expected.shape == (int(0.5 * RATE) - int(0.2 * RATE), 2)
    assert response.content == audio_codec.encode(expected, RATE, "pcm")


def test_concurrent_requests_share_dit_steps_and_stay_bit_equal(audio_server, reference):
    """Two requests straight to the `stable_audio` Triton model, the second sent once the first is denoising:
    they share stable_audio_dit forwards (batch_jobs 2: CFG with zeros as uncond, next to no CFG; other prompts,
    seconds, seeds and step counts), yet each float32 clip equals StableAudioPipeline's bit for bit."""
    bodies = [dict(prompt="a red car driving at night", audio_length=0.7, num_inference_steps=40,
                   guidance_scale=7.0, seed=3),
              dict(prompt="a bird singing", audio_length=0.25, num_inference_steps=5, guidance_scale=1.0, seed=5)]
    results = overlapping_streams(audio_server.grpc_url, "stable_audio", bodies, "AUDIO")
    for body, (done, audio) in zip(bodies, batched_finals(bodies, results)):
        samples = int(body["audio_length"] * RATE)
        assert done == {"type": "audio", "sample_rate": RATE, "channels": 2, "samples": samples, "audio_start": 0.0,
                        "audio_length": body["audio_length"], "seed": body["seed"]}
        expected = reference(body["prompt"], length=body["audio_length"], steps=body["num_inference_steps"],
                             seed=body["seed"], guidance_scale=body["guidance_scale"])
        assert audio.dtype == np.float32 and audio.shape == (samples, 2) and np.array_equal(audio, expected)


@pytest.mark.parametrize("body, param, code", [
    ({"input": ""}, "input", "empty_input"),
    ({"input": None}, "input", "invalid_value"),
    ({"audio_length": 5.0}, "audio_length", None),            # longer than the checkpoint's 0.743 s
    ({"audio_start": 0.5, "audio_length": 0.5}, "audio_length", None),   # ends past it
    ({"audio_length": 0}, "audio_length", "invalid_value"),
    ({"audio_start": -1}, "audio_start", "invalid_value"),
    ({"num_inference_steps": 0}, "num_inference_steps", "invalid_value"),
    ({"num_inference_steps": 201}, "num_inference_steps", None),   # the config's max_steps
    ({"guidance_scale": "7"}, "guidance_scale", "invalid_value"),
    ({"seed": -1}, "seed", "invalid_value"),
    ({"response_format": "ogg"}, "response_format", "invalid_value"),
    ({"speed": 2.0}, "speed", "unsupported_parameter"),
    ({"stream_format": "sse"}, "stream_format", "invalid_value"),
    ({"voice": "alloy"}, "voice", "unsupported_parameter"),   # not a field of this route
])
def test_bad_input_is_a_400_naming_the_field(audio_server, body, param, code):
    response = _generate(audio_server, timeout=30, **{"input": "a cat", "num_inference_steps": 1, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param) and error["message"], error
    assert code is None or error["code"] == code, error
    assert wait_for(lambda: _inflight_zero(audio_server), 10)


def test_unknown_model_is_a_404_and_the_server_keeps_serving(audio_server):
    missing = _generate(audio_server, timeout=30, input="a cat", model="stable-audio-2")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    ok = _generate(audio_server, input="a cat", model="stable-audio-open-1.0", audio_length=0.1, num_inference_steps=1)
    assert ok.status_code == 200 and sf.read(io.BytesIO(ok.content))[0].shape == (4410, 2)
    models = {m["id"]: m for m in httpx.get(f"{audio_server.base_url}/v1/models", timeout=10).json()["data"]}
    assert models["stable_audio"]["kind"] == "audio" and "stable_audio_dit" in models["stable_audio"]["triton_models"]


def test_a_client_that_leaves_cancels_its_denoising(audio_server):
    """A client that gives up mid-generation: the Triton request is cancelled, the DiT job leaves its batch slot
    (cancelled, not run to its 200 steps) and every in-flight gauge returns to 0."""
    metrics = audio_server.metrics_url
    before = metric_value(metrics, "omni_requests_total", model="stable_audio_dit", outcome="cancelled") or 0
    with pytest.raises(httpx.ReadTimeout):
        _generate(audio_server, timeout=2, input="a long drone", num_inference_steps=200, seed=1)
    assert wait_for(lambda: _inflight_zero(audio_server), 10)
    assert metric_value(metrics, "omni_requests_total", model="stable_audio_dit", outcome="cancelled") == before + 1
