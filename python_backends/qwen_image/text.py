"""Qwen-Image text encoding: the pipelines' own `encode_prompt` on the Qwen2.5-VL text encoder, one prompt
per call (as the pipelines call it; batching prompts would pad them and change their embeddings).

Text-to-image: `QwenImagePipeline.encode_prompt(prompt)`. Edit: `QwenImageEditPipeline.encode_prompt(prompt,
image)` with the condition image resized as the edit pipeline's `__call__` resizes it (`condition_size`).
"""
from __future__ import annotations

import numpy as np
import torch
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
from PIL import Image

from omni_backends.qwen_image import loading
from omni_backends.qwen_image.denoiser import MAX_SEQUENCE_LENGTH

CONDITION_AREA = 1024 * 1024  # QwenImageEditPipeline resizes the condition image to about this many pixels


def condition_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) the edit pipeline resizes a condition image of this size to (multiples of 32)."""
    w, h, _ = calculate_dimensions(CONDITION_AREA, width / height)
    return int(w), int(h)


class TextEncoder:
    """text_encoder: `Qwen2_5_VLForConditionalGeneration`; tokenizer; processor: the edit pipeline's
    Qwen2-VL processor (None: no edits)."""

    def __init__(self, checkpoint, text_encoder, tokenizer, processor=None):
        self.pipe = loading.pipeline(checkpoint, text_encoder=text_encoder, tokenizer=tokenizer)
        self.edit_pipe = None if processor is None else loading.pipeline(
            checkpoint, edit=True, text_encoder=text_encoder, tokenizer=tokenizer, processor=processor)

    @torch.no_grad()
    def encode(self, prompt: str, image: np.ndarray | None = None) -> np.ndarray:
        """Prompt embeddings float32 [L, D] (the text encoder's last hidden state without the template prefix).

        image: uint8 [H, W, 3] condition image for edits. Raises ValueError for an edit without a processor.
        """
        if image is None:
            embeds, _ = self.pipe.encode_prompt(prompt=prompt, device="cpu", num_images_per_prompt=1,
                                                max_sequence_length=MAX_SEQUENCE_LENGTH)
            return embeds[0].float().numpy()
        if self.edit_pipe is None:
            raise ValueError("this checkpoint has no processor/ for the edit pipeline")
        pil = Image.fromarray(image)
        width, height = condition_size(*pil.size)
        resized = self.edit_pipe.image_processor.resize(pil, height, width)
        embeds, _ = self.edit_pipe.encode_prompt(image=resized, prompt=prompt, device="cpu", num_images_per_prompt=1,
                                                 max_sequence_length=MAX_SEQUENCE_LENGTH)
        return embeds[0].float().numpy()
