"""Qwen-Image text encoding: the pipelines' own `encode_prompt` on the Qwen2.5-VL text encoder, one prompt
per call (as the pipelines call it; batching prompts would pad them and change their embeddings).

Text-to-image: `QwenImagePipeline.encode_prompt(prompt)`. Edit with one image:
`QwenImageEditPipeline.encode_prompt(prompt, image)` with the image resized as that pipeline's `__call__`
resizes it (about 1024x1024); with several images: `QwenImageEditPlusPipeline.encode_prompt(prompt, images)`
("Picture k:" per image, each resized to about 384x384 as its `__call__` does).
"""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE
from PIL import Image

from omni_backends.qwen_image import loading
from omni_backends.qwen_image.denoiser import MAX_SEQUENCE_LENGTH

CONDITION_AREA = 1024 * 1024  # QwenImageEditPipeline resizes the condition image to about this many pixels


def condition_size(width: int, height: int, area: int = CONDITION_AREA) -> tuple[int, int]:
    """(width, height) the edit pipelines resize a condition image of this size to (about `area` pixels,
    multiples of 32)."""
    w, h, _ = calculate_dimensions(area, width / height)
    return int(w), int(h)


class TextEncoder:
    """text_encoder: `Qwen2_5_VLForConditionalGeneration`; tokenizer; processor: the edit pipeline's
    Qwen2-VL processor (None: no edits)."""

    def __init__(self, checkpoint, text_encoder, tokenizer, processor=None):
        parts = dict(text_encoder=text_encoder, tokenizer=tokenizer, processor=processor)
        self.pipe = loading.pipeline(checkpoint, **parts)
        self.edit = {v: loading.pipeline(checkpoint, v, **parts) for v in ("edit", "edit_plus")} if processor else {}

    @torch.no_grad()
    def encode(self, prompt: str, images: list[np.ndarray] = ()) -> np.ndarray:
        """Prompt embeddings float32 [L, D] (the text encoder's last hidden state without the template prefix).

        images: uint8 [H, W, 3] condition images of an edit (one: Edit, several: EditPlus). Raises ValueError
        for an edit on a checkpoint without processor/.
        """
        if not images:
            embeds, _ = self.pipe.encode_prompt(prompt=prompt, device="cpu", num_images_per_prompt=1,
                                                max_sequence_length=MAX_SEQUENCE_LENGTH)
            return embeds[0].float().numpy()
        if not self.edit:
            raise ValueError("this checkpoint has no processor/ for the edit pipelines")
        pipe = self.edit["edit" if len(images) == 1 else "edit_plus"]
        area = CONDITION_AREA if len(images) == 1 else CONDITION_IMAGE_SIZE
        resized = []
        for image in images:
            pil = Image.fromarray(image)
            width, height = condition_size(*pil.size, area)
            resized.append(pipe.image_processor.resize(pil, height, width))
        embeds, _ = pipe.encode_prompt(image=resized[0] if len(images) == 1 else resized, prompt=prompt, device="cpu",
                                       num_images_per_prompt=1, max_sequence_length=MAX_SEQUENCE_LENGTH)
        return embeds[0].float().numpy()
