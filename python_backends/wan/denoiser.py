"""The Wan denoiser: jobs of `WanPipeline` requests advanced one step at a time, many jobs per transformer
forward (omni_backends.diffusion).

A job is made with the pipeline's own `prepare_latents` (noise from `torch.Generator().manual_seed(seed)`)
and its own copy of the checkpoint's scheduler (`set_timesteps`, `set_begin_index(0)`), as
`WanPipeline.__call__` prepares it. A step follows `__call__`'s loop: Wan2.2's two experts split the
timesteps at `boundary_ratio * num_train_timesteps` (the high-noise `transformer` with `guidance_scale`
above it, the low-noise `transformer_2` with `guidance_scale_2` below); the rows of every job that uses the
same expert at this step share one forward (cond rows, and uncond rows when guidance_scale > 1), which
`SegmentedForward` keeps bit-equal to the pipeline's separate cond / uncond calls; CFG is combined as the
pipeline does (`uncond + g * (cond - uncond)`) and the job's scheduler `step`s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from omni_backends.diffusion.engine import DenoiseJob, Denoiser
from omni_backends.diffusion.segments import SegmentedForward, pad_text
from omni_backends.wan import loading

MAX_SEQUENCE_LENGTH = 512  # WanPipeline.__call__'s default: prompts are padded to it
_TEXT_LINEARS = ("condition_embedder.text_embedder.", "attn2.to_k", "attn2.to_v")


@dataclass
class WanJob(DenoiseJob):
    """One request: one video. latents: float32 [1, C, F', h, w]; embeds / negative: [1, L, D] (negative
    None without CFG); guidance: (guidance_scale, guidance_scale_2); boundary: the timestep at which the
    low-noise expert takes over (None: one expert)."""

    latents: torch.Tensor = None
    embeds: torch.Tensor = None
    negative: torch.Tensor | None = None
    guidance: tuple[float, float] = (1.0, 1.0)
    boundary: float | None = None
    scheduler: object = None
    timesteps: torch.Tensor = None


def _trim_attention(kwargs: dict, length: int) -> dict:
    context = kwargs.get("encoder_hidden_states")
    return kwargs if context is None else {**kwargs, "encoder_hidden_states": context[:, :length]}


class WanDenoiser(Denoiser):
    """transformer / transformer_2 (None for one-expert checkpoints): `WanTransformer3DModel`; scheduler: the
    checkpoint's scheduler (each job gets its own copy); checkpoint: the directory (for its layout)."""

    def __init__(self, checkpoint, transformer, transformer_2, scheduler):
        self.layout = loading.layout(checkpoint)
        if self.layout.expand_timesteps:
            raise ValueError(f"{checkpoint}: per-token timesteps (expand_timesteps, Wan2.2 TI2V) are not served yet")
        self.experts = [m for m in (transformer, transformer_2) if m is not None]
        self.scheduler = scheduler
        self.pipe = loading.pipeline(checkpoint, transformer=transformer, transformer_2=transformer_2,
                                     scheduler=scheduler)
        self.dtype = self.experts[0].dtype
        self.segments = {id(m): SegmentedForward(m, lambda name: any(p in name for p in _TEXT_LINEARS),
                                                 _trim_attention) for m in self.experts}

    def check(self, *, height: int, width: int, num_frames: int, steps: int) -> None:
        """Raises ValueError unless the pipeline would run this size unchanged (it rounds silently)."""
        multiple, temporal = self.layout.size_multiple, self.layout.scale_temporal
        if height <= 0 or width <= 0 or height % multiple or width % multiple:
            raise ValueError(f"height and width must be positive multiples of {multiple}, got {width}x{height}")
        if num_frames < 1 or (num_frames - 1) % temporal:
            raise ValueError(f"num_frames must be {temporal}k+1, got {num_frames}")
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")

    def make_job(self, embeds: np.ndarray, negative: np.ndarray | None, *, height: int, width: int,
                 num_frames: int, steps: int, seed: int, guidance_scale: float,
                 guidance_scale_2: float | None = None) -> WanJob:
        """A job as `WanPipeline.__call__` prepares it.

        embeds / negative: float32 [L, D] prompt embeddings (`_get_t5_prompt_embeds`, one prompt); negative is
        used when guidance_scale > 1 (CFG; the pipeline encodes "" when no negative prompt is given).
        guidance_scale_2: the low-noise expert's scale (None: guidance_scale). Raises ValueError as `check`,
        or when CFG is asked without negative embeddings.
        """
        self.check(height=height, width=width, num_frames=num_frames, steps=steps)
        cfg = guidance_scale > 1.0
        if cfg and negative is None:
            raise ValueError("guidance_scale > 1 needs negative prompt embeddings")
        scheduler = type(self.scheduler).from_config(self.scheduler.config)
        scheduler.set_timesteps(steps, device="cpu")
        scheduler.set_begin_index(0)
        latents = self.pipe.prepare_latents(1, self.layout.latent_channels, height, width, num_frames, torch.float32,
                                            "cpu", torch.Generator().manual_seed(seed))
        ratio = self.layout.boundary_ratio if len(self.experts) > 1 else None
        return WanJob(bucket=tuple(latents.shape), total_steps=len(scheduler.timesteps), latents=latents,
                      embeds=torch.from_numpy(embeds)[None].to(self.dtype),
                      negative=torch.from_numpy(negative)[None].to(self.dtype) if cfg else None,
                      guidance=(guidance_scale, guidance_scale if guidance_scale_2 is None else guidance_scale_2),
                      boundary=None if ratio is None else ratio * scheduler.config.num_train_timesteps,
                      scheduler=scheduler, timesteps=scheduler.timesteps)

    def rows(self, job: WanJob) -> int:
        return 2 if job.negative is not None else 1

    def latents(self, job: WanJob) -> np.ndarray:
        return job.latents[0].float().numpy()

    def _expert(self, job: WanJob) -> int:
        t = job.timesteps[job.step]
        return 0 if job.boundary is None or t >= job.boundary else 1

    @torch.no_grad()
    def step(self, jobs: list[WanJob]) -> None:
        by_expert: dict[int, list[WanJob]] = {}
        for job in jobs:
            by_expert.setdefault(self._expert(job), []).append(job)
        for expert, group in by_expert.items():
            self._step(self.experts[expert], expert, group)

    def _step(self, model, expert: int, jobs: list[WanJob]) -> None:
        hidden, times, texts, lengths = [], [], [], []
        for job in jobs:
            t = job.timesteps[job.step]
            for embeds in (job.embeds, job.negative):
                if embeds is not None:
                    hidden.append(job.latents.to(self.dtype))
                    times.append(t.expand(1))
                    texts.append(embeds)
                    lengths.append(embeds.shape[1])
        width = max(lengths)
        with self.segments[id(model)].layout([1] * len(hidden), lengths):
            out = model(hidden_states=torch.cat(hidden), timestep=torch.cat(times),
                        encoder_hidden_states=torch.cat([pad_text(x, width) for x in texts]), return_dict=False)[0]
        row = 0
        for job in jobs:
            noise_pred = out[row:row + 1]
            row += 1
            if job.negative is not None:
                noise_uncond = out[row:row + 1]
                row += 1
                noise_pred = noise_uncond + job.guidance[expert] * (noise_pred - noise_uncond)
            job.latents = job.scheduler.step(noise_pred, job.timesteps[job.step], job.latents, return_dict=False)[0]
            job.step += 1
