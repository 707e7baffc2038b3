"""Stable Audio VAE decode: latents -> the waveform cut to the requested clip, as `StableAudioPipeline.__call__`
does it (`vae.decode(latents).sample[:, :, start:end]`, output_type "np")."""
from __future__ import annotations

import numpy as np
import torch


class StableAudioVAE:
    """vae: `AutoencoderOobleck`."""

    def __init__(self, vae):
        self.vae = vae

    @torch.no_grad()
    def decode(self, latents: np.ndarray, start: float, end: float) -> np.ndarray:
        """latents: float32 [C, L] (one clip) -> float32 [channels, samples] of the seconds [start, end):
        samples int(end * rate) - int(start * rate), rate: the VAE's sampling_rate."""
        rate = self.vae.config.sampling_rate
        x = torch.from_numpy(np.ascontiguousarray(latents))[None].to(self.vae.dtype)
        audio = self.vae.decode(x).sample[:, :, int(start * rate):int(end * rate)]
        return audio[0].float().numpy()
