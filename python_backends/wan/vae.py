"""Wan VAE decode: latents -> uint8 RGB frames with the pipeline's own latent de-normalisation
(`latents / (1 / std) + mean`, as `WanPipeline.__call__` writes it) and `VideoProcessor.postprocess_video`,
so frames equal the pipeline's `output_type="np"` frames scaled to 0..255 and rounded."""
from __future__ import annotations

import numpy as np
import torch

from omni_backends.wan import loading


class WanVAE:
    """vae: `AutoencoderKLWan`."""

    def __init__(self, checkpoint, vae):
        self.vae = vae
        self.pipe = loading.pipeline(checkpoint, vae=vae)

    @torch.no_grad()
    def decode(self, latents: np.ndarray) -> np.ndarray:
        """latents: float32 [C, F', h, w] (one video, normalised) -> uint8 [F, H, W, 3] with F = (F' - 1) * 4 + 1
        and H, W = 8 h, 8 w for the Wan2.1 VAE."""
        config = self.vae.config
        x = torch.from_numpy(np.ascontiguousarray(latents))[None].to(self.vae.dtype)
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(x.device, x.dtype)
        std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(x.device, x.dtype)
        video = self.vae.decode(x / std + mean, return_dict=False)[0]
        frames = self.pipe.video_processor.postprocess_video(video, output_type="np")[0]
        return (frames * 255).round().astype(np.uint8)
