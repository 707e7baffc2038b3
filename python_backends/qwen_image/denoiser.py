"""The Qwen-Image denoiser: jobs of `QwenImagePipeline` / `QwenImageEditPipeline` requests, advanced one
step at a time, many jobs per transformer forward (omni_backends.diffusion).

A job is made with the pipeline's own `encode_prompt` (repeat for n images), `prepare_latents` (noise
from `torch.Generator().manual_seed(seed)`; edit: packed condition latents), `calculate_shift` and
`retrieve_timesteps`; a step runs the transformer on every row of a group of jobs (`SegmentedForward`
keeps each job's rows bit-equal to its unbatched pipeline call), combines true CFG exactly like the
pipeline (`neg + s * (cond - neg)`, rescaled to the cond norm) and calls the job's scheduler `step`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

from omni_backends.diffusion.engine import DenoiseJob, Denoiser
from omni_backends.diffusion.segments import SegmentedForward, pad_text
from omni_backends.qwen_image import loading

MAX_SEQUENCE_LENGTH = 512  # the pipelines' default
_TEXT_LINEARS = ("txt_in", ".add_q_proj", ".add_k_proj", ".add_v_proj", ".to_add_out", "txt_mlp.")


@dataclass
class QwenImageJob(DenoiseJob):
    """One request: n images of height x width. latents: float32 [n, seq, 64] (packed 2x2 patches);
    image_latents: packed condition latents [n, seq_c, 64] (edit) or None; embeds / negative: [n, L, D]
    (negative None without true CFG); img_shapes: the transformer's RoPE shapes."""

    latents: torch.Tensor = None
    image_latents: torch.Tensor | None = None
    embeds: torch.Tensor = None
    negative: torch.Tensor | None = None
    cfg_scale: float = 1.0
    img_shapes: list = None
    scheduler: object = None
    timesteps: torch.Tensor = None


def _trim_attention(kwargs: dict, length: int) -> dict:
    img_freqs, txt_freqs = kwargs["image_rotary_emb"]
    return {**kwargs, "encoder_hidden_states": kwargs["encoder_hidden_states"][:, :length],
            "encoder_hidden_states_mask": None, "image_rotary_emb": (img_freqs, txt_freqs[:length])}


class QwenImageDenoiser(Denoiser):
    """transformer: `QwenImageTransformer2DModel`; scheduler: the checkpoint's FlowMatchEulerDiscreteScheduler
    (each job gets its own copy); checkpoint: the directory (for the pipelines' template offsets)."""

    def __init__(self, transformer, scheduler, checkpoint):
        self.transformer, self.scheduler_config = transformer, scheduler.config
        self.pipes = {v: loading.pipeline(checkpoint, v, transformer=transformer, scheduler=scheduler)
                      for v in ("t2i", "edit", "edit_plus")}
        self.segments = SegmentedForward(transformer, lambda name: any(p in name for p in _TEXT_LINEARS),
                                         _trim_attention)

    @property
    def latent_channels(self) -> int:
        return self.transformer.config.in_channels // 4

    def make_job(self, embeds: np.ndarray, negative: np.ndarray | None, *, n: int, height: int, width: int,
                 steps: int, seed: int, cfg_scale: float, conditions: list[np.ndarray] = ()) -> QwenImageJob:
        """A job as the pipeline's `__call__` prepares it.

        embeds / negative: float32 [L, D] prompt embeddings (`encode_prompt` output, one prompt); negative is
        used only when cfg_scale > 1 (true CFG). conditions: the VAE latents of the edit's condition images,
        float32 [16, 1, h, w] each (none for text-to-image; one: QwenImageEditPipeline; several:
        QwenImageEditPlusPipeline). height / width: pixels, multiples of 16.
        """
        pipe = self.pipes["t2i" if not conditions else "edit" if len(conditions) == 1 else "edit_plus"]
        dtype = self.transformer.dtype
        cond, _ = pipe.encode_prompt(prompt=None, prompt_embeds=torch.from_numpy(embeds)[None].to(dtype),
                                     device="cpu", num_images_per_prompt=n, max_sequence_length=MAX_SEQUENCE_LENGTH)
        neg = None
        if cfg_scale > 1 and negative is not None:
            neg, _ = pipe.encode_prompt(prompt=None, prompt_embeds=torch.from_numpy(negative)[None].to(dtype),
                                        device="cpu", num_images_per_prompt=n, max_sequence_length=MAX_SEQUENCE_LENGTH)
        generator = torch.Generator().manual_seed(seed)
        scale = pipe.vae_scale_factor
        shapes = [(1, height // scale // 2, width // scale // 2)]
        if conditions:
            images = [torch.from_numpy(c)[None] for c in conditions]
            latents, image_latents = pipe.prepare_latents(images[0] if len(images) == 1 else images, n,
                                                          self.latent_channels, height, width, cond.dtype, "cpu",
                                                          generator)
            shapes += [(1, c.shape[-2] // 2, c.shape[-1] // 2) for c in conditions]
        else:
            latents = pipe.prepare_latents(n, self.latent_channels, height, width, cond.dtype, "cpu", generator)
            image_latents = None
        scheduler = type(pipe.scheduler).from_config(self.scheduler_config)
        config = scheduler.config
        mu = calculate_shift(latents.shape[1], config.get("base_image_seq_len", 256),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.5),
                             config.get("max_shift", 1.15))
        timesteps, steps = retrieve_timesteps(scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        scheduler.set_begin_index(0)
        return QwenImageJob(bucket=tuple(shapes), total_steps=steps, latents=latents, image_latents=image_latents,
                            embeds=cond, negative=neg, cfg_scale=cfg_scale, img_shapes=[shapes], scheduler=scheduler,
                            timesteps=timesteps)

    def rows(self, job: QwenImageJob) -> int:
        return job.latents.shape[0] * (2 if job.negative is not None else 1)

    def latents(self, job: QwenImageJob) -> np.ndarray:
        return job.latents.float().numpy()

    @torch.no_grad()
    def step(self, jobs: list[QwenImageJob]) -> None:
        hidden, times, texts, rows, lengths = [], [], [], [], []
        for job in jobs:
            t = job.timesteps[job.step]
            model_input = job.latents if job.image_latents is None else torch.cat([job.latents, job.image_latents], 1)
            for embeds in (job.embeds, job.negative):
                if embeds is None:
                    continue
                hidden.append(model_input)
                times.append(t.expand(job.latents.shape[0]).to(job.latents.dtype) / 1000)
                texts.append(embeds)
                rows.append(embeds.shape[0])
                lengths.append(embeds.shape[1])
        width = max(lengths)
        with self.segments.layout(rows, lengths):
            out = self.transformer(hidden_states=torch.cat(hidden), timestep=torch.cat(times),
                                   encoder_hidden_states=torch.cat([pad_text(x, width) for x in texts]),
                                   encoder_hidden_states_mask=None, img_shapes=jobs[0].img_shapes,
                                   return_dict=False)[0]
        start = 0
        for job in jobs:
            n, seq = job.latents.shape[0], job.latents.shape[1]
            noise_pred = out[start:start + n, :seq]
            start += n
            if job.negative is not None:
                neg_noise_pred = out[start:start + n, :seq]
                start += n
                comb_pred = neg_noise_pred + job.cfg_scale * (noise_pred - neg_noise_pred)
                cond_norm = torch.norm(noise_pred, dim=-1, keepdim=True)
                noise_norm = torch.norm(comb_pred, dim=-1, keepdim=True)
                noise_pred = comb_pred * (cond_norm / noise_norm)
            job.latents = job.scheduler.step(noise_pred, job.timesteps[job.step], job.latents, return_dict=False)[0]
            job.step += 1
