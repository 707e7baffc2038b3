"""The Stable Audio stages in-process, against diffusers' own StableAudioPipeline on the tiny checkpoint: the
conditioner, the step-batched denoiser (jobs with and without CFG, with a negative prompt or zeros as uncond,
different seconds, seeds and step counts sharing forwards, the longest then running alone) and the VAE give
bit-equal float32 audio."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_backends.paths import model_home
from omni_backends.stable_audio import loading
from omni_backends.stable_audio.checkpoint import write_checkpoint
from omni_backends.stable_audio.denoiser import StableAudioDenoiser
from omni_backends.stable_audio.serving.protocol import TINY
from omni_backends.stable_audio.text import StableAudioConditioner
from omni_backends.stable_audio.vae import StableAudioVAE

pytestmark = pytest.mark.unit
JOBS = [dict(prompt="a dog barking", negative=None, start=0.0, end=0.7, steps=5, seed=3, guidance=7.0),
        dict(prompt="waves crashing on a beach", negative="low quality", start=0.1, end=0.5, steps=3, seed=5,
             guidance=3.0),
        dict(prompt="a red car", negative=None, start=0.0, end=0.3, steps=2, seed=9, guidance=1.0)]


@pytest.fixture(scope="module")
def checkpoint():
    return write_checkpoint(model_home() / TINY)


def test_layout_of_the_tiny_checkpoint(checkpoint):
    layout = loading.layout(checkpoint)
    assert (layout.sample_rate, layout.channels, layout.hop, layout.sample_size) == (44100, 2, 128, 256)
    assert layout.max_duration == 256 * 128 / 44100 and layout.samples(0.2, 0.5) == 22050 - 8820
    with pytest.raises(FileNotFoundError, match="not a Stable Audio diffusers checkpoint"):
        loading.layout(checkpoint / "vae")


def test_batched_stages_equal_the_pipeline_bit_for_bit(checkpoint):
    component = lambda name: loading.component(checkpoint, name)  # noqa: E731
    conditioner = StableAudioConditioner(component("text_encoder"), component("tokenizer"), component("projection_model"))
    denoiser = StableAudioDenoiser(component("transformer"), component("scheduler"), 2)
    vae = StableAudioVAE(component("vae"))
    jobs = []
    for j in JOBS:
        text, duration = conditioner.encode(j["prompt"], j["negative"], start=j["start"], end=j["end"],
                                            cfg=j["guidance"] > 1)
        jobs.append(denoiser.make_job(text, duration, steps=j["steps"], seed=j["seed"], guidance_scale=j["guidance"]))
    assert [denoiser.rows(job) for job in jobs] == [2, 2, 1]                 # CFG: [uncond, cond]
    assert not jobs[0].text[0].any() and jobs[1].text[0].any()              # zeros, or the negative prompt
    sizes = []
    while live := [job for job in jobs if job.step < job.total_steps]:
        sizes.append(len(live))
        denoiser.step(live)
    assert sizes == [3, 3, 2, 1, 1]
    reference = loading.reference_pipeline(checkpoint)
    for j, job in zip(JOBS, jobs):
        audio = vae.decode(denoiser.latents(job), j["start"], j["end"])
        with torch.no_grad():
            expected = reference(j["prompt"], negative_prompt=j["negative"], audio_start_in_s=j["start"],
                                 audio_end_in_s=j["end"], num_inference_steps=j["steps"], guidance_scale=j["guidance"],
                                 generator=torch.Generator().manual_seed(j["seed"]), output_type="np").audios[0]
        assert audio.dtype == np.float32 and audio.shape == (2, int(j["end"] * 44100) - int(j["start"] * 44100))
        assert np.array_equal(audio, expected), j["prompt"]


def test_denoiser_refuses_rows_that_do_not_match_the_guidance(checkpoint):
    denoiser = StableAudioDenoiser(loading.component(checkpoint, "transformer"),
                                   loading.component(checkpoint, "scheduler"), 2)
    text, duration = np.zeros((1, 34, 64), np.float32), np.zeros((1, 1, 128), np.float32)
    with pytest.raises(ValueError, match="needs 2 conditioning row"):
        denoiser.make_job(text, duration, steps=2, seed=0, guidance_scale=7.0)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        denoiser.make_job(text, duration, steps=0, seed=0, guidance_scale=1.0)
