"""Qwen-Image VAE: decode packed latents to uint8 RGB images, and encode edit condition images to
latents, with the pipelines' own `_unpack_latents`, latent (de)normalisation, `_encode_vae_image` and
`VaeImageProcessor` (so pixels equal the pipelines' PIL output)."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from omni_backends.qwen_image import loading
from omni_backends.qwen_image.text import condition_size


class ImageVAE:
    """vae: `AutoencoderKLQwenImage`."""

    def __init__(self, checkpoint, vae):
        self.vae = vae
        self.pipe = loading.pipeline(checkpoint, vae=vae)
        self.edit_pipe = loading.pipeline(checkpoint, "edit", vae=vae)

    @torch.no_grad()
    def decode(self, latents: np.ndarray, height: int, width: int) -> np.ndarray:
        """latents: float32 [n, (H/16)*(W/16), 64] packed -> uint8 [n, H, W, 3] (as the pipeline's PIL images)."""
        pipe, config = self.pipe, self.vae.config
        x = pipe._unpack_latents(torch.from_numpy(latents), height, width, pipe.vae_scale_factor).to(self.vae.dtype)
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(x.device, x.dtype)
        std = 1.0 / torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(x.device, x.dtype)
        image = self.vae.decode(x / std + mean, return_dict=False)[0][:, :, 0]
        image = pipe.image_processor.postprocess(image, output_type="np")
        return (image * 255).round().astype(np.uint8)

    @torch.no_grad()
    def encode_condition(self, image: np.ndarray) -> np.ndarray:
        """uint8 [H, W, 3] condition image -> float32 [16, 1, h, w] normalised latents, resized and encoded as
        `QwenImageEditPipeline` and `QwenImageEditPlusPipeline` do, one image per call (about 1024x1024 pixels,
        `sample_mode="argmax"`: no randomness)."""
        pipe = self.edit_pipe
        pil = Image.fromarray(image)
        width, height = condition_size(*pil.size)
        resized = pipe.image_processor.resize(pil, height, width)
        pixels = pipe.image_processor.preprocess(resized, height, width).unsqueeze(2).to(dtype=self.vae.dtype)
        return pipe._encode_vae_image(image=pixels, generator=None)[0].float().numpy()
