"""The Stable Audio denoiser: jobs of `StableAudioPipeline` requests advanced one step at a time, many jobs per
DiT forward (omni_backends.diffusion).

A job is made as `StableAudioPipeline.__call__` prepares one: noise from the pipeline's own `prepare_latents`
with `torch.Generator().manual_seed(seed)`, which the job keeps for the scheduler's steps (the SDE solver's
Brownian tree is seeded from it), and its own copy of the checkpoint's scheduler. Every job denoises the DiT's
full `sample_size` latents (the pipeline cuts the clip from the decoded waveform), so all jobs share one
bucket. A step follows `__call__`'s loop: a job's rows ([uncond, cond] with CFG, as the pipeline batches them,
or [cond]) join one forward with the other jobs' rows, `SegmentedForward` keeping each job's GEMMs and
attention at the pipeline's shapes; the timestep embedding, which the pipeline computes once for its rows
(timestep [1], broadcast), is computed once per job the same way. CFG is combined as the pipeline does
(`uncond + g * (cond - uncond)`) and the job's scheduler `step`s with its generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_backends.diffusion.engine import DenoiseJob, Denoiser
from omni_backends.diffusion.segments import SegmentedForward
from omni_backends.stable_audio import loading


@dataclass
class StableAudioJob(DenoiseJob):
    """One request: one clip. latents: float32 [1, C, L]; text / duration: the conditioning rows
    ([R, T + 2, D] and [R, 1, 2 D], `text.StableAudioConditioner.encode`); guidance_scale: CFG weight (R = 2);
    generator: the request's torch.Generator (noise, then the scheduler's steps); step_kwargs: what the pipeline
    passes the scheduler's `step` besides (its `prepare_extra_step_kwargs`: the generator if `step` takes one)."""

    latents: torch.Tensor = None
    text: torch.Tensor = None
    duration: torch.Tensor = None
    guidance_scale: float = 1.0
    generator: torch.Generator = None
    scheduler: object = None
    step_kwargs: dict = None


class StableAudioDenoiser(Denoiser):
    """transformer: `StableAudioDiTModel`; scheduler: the checkpoint's scheduler (each job gets its own copy);
    channels: the VAE's audio channels (the pipeline draws its noise with them)."""

    def __init__(self, transformer, scheduler, channels: int):
        from diffusers.models.embeddings import get_1d_rotary_pos_embed

        self.transformer, self.scheduler, self.channels = transformer, scheduler, channels
        self.pipe = loading.pipeline(transformer=transformer, scheduler=scheduler)
        config = transformer.config
        self.rotary = get_1d_rotary_pos_embed(config.attention_head_dim // 2, config.sample_size + 1, use_real=True,
                                              repeat_interleave_real=False)
        self._rows: list[int] | None = None   # rows of each job of the forward in progress
        self.segments = SegmentedForward(transformer, lambda name: False, lambda kwargs, length: kwargs)
        for module in (transformer.time_proj, transformer.timestep_proj):
            self._per_job(module)

    def _per_job(self, module: torch.nn.Module) -> None:
        """`module` (a part of the timestep embedding) runs on each segment's first row and is broadcast to its rows."""
        forward = module.forward

        def per_job(x: torch.Tensor) -> torch.Tensor:
            if self._rows is None or x.shape[0] != sum(self._rows):
                return forward(x)
            starts = np.cumsum([0, *self._rows[:-1]]).tolist()
            return torch.cat([forward(x[start:start + 1]).expand(rows, -1) for start, rows in zip(starts, self._rows)])
        module.forward = per_job

    def make_job(self, text: np.ndarray, duration: np.ndarray, *, steps: int, seed: int,
                 guidance_scale: float) -> StableAudioJob:
        """A job as `StableAudioPipeline.__call__` prepares it. text / duration: float32 [R, T + 2, D] and
        [R, 1, 2 D] with R = 2 when guidance_scale > 1, else 1. Raises ValueError for other row counts, a
        conditioning width the DiT does not take, or steps < 1."""
        config = self.transformer.config
        rows = 2 if guidance_scale > 1.0 else 1
        if text.ndim != 3 or duration.ndim != 3 or text.shape[0] != rows or duration.shape[0] != rows:
            raise ValueError(f"guidance_scale {guidance_scale} needs {rows} conditioning row(s), got text "
                             f"{list(text.shape)} and duration {list(duration.shape)}")
        if text.shape[2] != config.cross_attention_input_dim or duration.shape[1:] != (1, config.global_states_input_dim):
            raise ValueError(f"conditioning must be [R, T, {config.cross_attention_input_dim}] and "
                             f"[R, 1, {config.global_states_input_dim}], got {list(text.shape)}, {list(duration.shape)}")
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        scheduler.set_timesteps(steps, device="cpu")
        generator = torch.Generator().manual_seed(seed)
        dtype = self.transformer.dtype
        latents = self.pipe.prepare_latents(1, config.in_channels, config.sample_size, dtype, "cpu", generator,
                                            audio_channels=self.channels)
        return StableAudioJob(bucket=tuple(latents.shape), total_steps=len(scheduler.timesteps), latents=latents,
                              text=torch.from_numpy(text).to(dtype), duration=torch.from_numpy(duration).to(dtype),
                              guidance_scale=guidance_scale, generator=generator, scheduler=scheduler,
                              step_kwargs=self.pipe.prepare_extra_step_kwargs(generator, 0.0))

    def rows(self, job: StableAudioJob) -> int:
        return job.text.shape[0]

    def latents(self, job: StableAudioJob) -> np.ndarray:
        return job.latents[0].float().numpy()

    @torch.no_grad()
    def step(self, jobs: list[StableAudioJob]) -> None:
        inputs, times = [], []
        for job in jobs:
            t = job.scheduler.timesteps[job.step]
            rows = self.rows(job)
            inputs.append(job.scheduler.scale_model_input(torch.cat([job.latents] * rows), t))
            times.append(t.expand(rows))
        self._rows = [self.rows(job) for job in jobs]
        try:
            with self.segments.layout(self._rows, [job.text.shape[1] for job in jobs]):
                out = self.transformer(torch.cat(inputs), torch.cat(times),
                                       encoder_hidden_states=torch.cat([job.text for job in jobs]),
                                       global_hidden_states=torch.cat([job.duration for job in jobs]),
                                       rotary_embedding=self.rotary, return_dict=False)[0]
        finally:
            self._rows = None
        row = 0
        for job in jobs:
            rows = self.rows(job)
            noise_pred = out[row:row + rows]
            row += rows
            if rows == 2:
                uncond, cond = noise_pred.chunk(2)
                noise_pred = uncond + job.guidance_scale * (cond - uncond)
            t = job.scheduler.timesteps[job.step]
            job.latents = job.scheduler.step(noise_pred, t, job.latents, **job.step_kwargs).prev_sample
            job.step += 1
