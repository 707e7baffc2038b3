"""Wan text encoding: `WanPipeline._get_t5_prompt_embeds` on the UMT5 encoder, one prompt per call (as the
pipeline's `encode_prompt` calls it for the prompt and for the negative prompt)."""
from __future__ import annotations

import numpy as np
import torch

from omni_backends.wan import loading
from omni_backends.wan.denoiser import MAX_SEQUENCE_LENGTH


class WanTextEncoder:
    """text_encoder: `UMT5EncoderModel`; tokenizer: its T5 tokenizer."""

    def __init__(self, checkpoint, text_encoder, tokenizer):
        self.pipe = loading.pipeline(checkpoint, text_encoder=text_encoder, tokenizer=tokenizer)

    @torch.no_grad()
    def encode(self, prompt: str) -> np.ndarray:
        """Prompt embeddings float32 [MAX_SEQUENCE_LENGTH, D]: the encoder's last hidden state over the cleaned,
        tokenized prompt (truncated to 512 tokens), zeroed past its length, as the pipeline pads it."""
        embeds = self.pipe._get_t5_prompt_embeds(prompt=prompt, max_sequence_length=MAX_SEQUENCE_LENGTH,
                                                 device="cpu")
        return embeds[0].float().numpy()
