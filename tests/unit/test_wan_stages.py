"""The Wan stages in-process, against diffusers' own WanPipeline on the tiny checkpoint: the text encoder,
the step-batched denoiser (several jobs with different prompts, seeds, step counts and CFG sharing
forwards of both Wan2.2 experts) and the VAE give bit-equal uint8 frames."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from omni_backends.diffusion import DenoiseLoop, DenoiseParams
from omni_backends.paths import model_home
from omni_backends.wan import loading
from omni_backends.wan.checkpoint import write_checkpoint
from omni_backends.wan.denoiser import WanDenoiser
from omni_backends.wan.serving.protocol import TINY
from omni_backends.wan.text import WanTextEncoder
from omni_backends.wan.vae import WanVAE

pytestmark = pytest.mark.unit
JOBS = [dict(prompt="a cat walking on the grass", negative="blurry", seed=1, steps=4, guidance=5.0, guidance_2=3.0),
        dict(prompt="a red car driving at night", negative="", seed=7, steps=5, guidance=1.0, guidance_2=None),
        dict(prompt="waves crashing on a beach", negative="static", seed=3, steps=2, guidance=3.0, guidance_2=None)]
SIZE = dict(height=32, width=32, num_frames=5)


@pytest.fixture(scope="module")
def checkpoint():
    return write_checkpoint(model_home() / TINY)


def test_layout_of_the_tiny_wan22_checkpoint(checkpoint):
    layout = loading.layout(checkpoint)
    assert (layout.pipeline, layout.boundary_ratio, layout.expand_timesteps) == ("WanPipeline", 0.875, False)
    assert (layout.size_multiple, layout.scale_temporal, layout.latent_shape(17, 64, 96)) == (16, 4, (16, 5, 8, 12))


def test_batched_stages_equal_the_pipeline_bit_for_bit(checkpoint):
    component = lambda name: loading.component(checkpoint, name)  # noqa: E731
    text = WanTextEncoder(checkpoint, component("text_encoder"), component("tokenizer"))
    denoiser = WanDenoiser(checkpoint, component("transformer"), component("transformer_2"), component("scheduler"))
    vae = WanVAE(checkpoint, component("vae"))
    jobs = [denoiser.make_job(text.encode(j["prompt"]), text.encode(j["negative"]), **SIZE, steps=j["steps"],
                              seed=j["seed"], guidance_scale=j["guidance"], guidance_scale_2=j["guidance_2"])
            for j in JOBS]
    assert denoiser.rows(jobs[0]) == 2 and denoiser.rows(jobs[1]) == 1    # CFG doubles the rows
    low_noise = [bool(t < job.boundary) for job in jobs for t in job.timesteps]
    assert any(low_noise) and not all(low_noise)                          # both Wan2.2 experts are used
    outputs, done = {}, threading.Event()

    def on_output(request_id, output):
        if output.finished:
            outputs[request_id] = output
            if len(outputs) == len(jobs):
                done.set()

    loop = DenoiseLoop(denoiser, max_running=8)
    for index, job in enumerate(jobs):
        loop.submit(str(index), job, DenoiseParams(), on_output)
    assert done.wait(120)
    stats = loop.stats()
    loop.shutdown()
    assert stats.max_batch_jobs == 3 and stats.steps == sum(j["steps"] for j in JOBS)
    reference = loading.reference_pipeline(checkpoint)
    for index, j in enumerate(JOBS):
        assert outputs[str(index)].finish_reason == "stop"
        frames = vae.decode(outputs[str(index)].latents)
        with torch.no_grad():
            expected = reference(j["prompt"], negative_prompt=j["negative"], **SIZE, num_inference_steps=j["steps"],
                                 guidance_scale=j["guidance"], guidance_scale_2=j["guidance_2"],
                                 generator=torch.Generator().manual_seed(j["seed"]), output_type="np").frames[0]
        assert frames.shape == (5, 32, 32, 3) and frames.dtype == np.uint8
        assert np.array_equal(frames, (expected * 255).round().astype(np.uint8)), f"job {index} differs"


@pytest.mark.parametrize("size, message", [(dict(height=40, width=48, num_frames=9), "multiples of 16"),
                                           (dict(height=32, width=48, num_frames=8), r"4k\+1")])
def test_denoiser_refuses_sizes_the_pipeline_would_round(checkpoint, size, message):
    denoiser = WanDenoiser(checkpoint, loading.component(checkpoint, "transformer"), None,
                           loading.component(checkpoint, "scheduler"))
    embeds = np.zeros((512, 32), np.float32)
    with pytest.raises(ValueError, match=message):
        denoiser.make_job(embeds, None, **size, steps=2, seed=0, guidance_scale=1.0)
