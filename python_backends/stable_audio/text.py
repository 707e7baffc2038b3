"""Stable Audio conditioning: prompt, negative prompt and the clip's seconds -> the DiT's two conditioning
inputs, exactly as `StableAudioPipeline.__call__` builds them (its `encode_prompt` and `encode_duration`, then
its concatenations), one request per call."""
from __future__ import annotations

import numpy as np
import torch

from omni_backends.stable_audio import loading


class StableAudioConditioner:
    """text_encoder: `T5EncoderModel`; tokenizer: its T5 tokenizer; projection_model: `StableAudioProjectionModel`."""

    def __init__(self, text_encoder, tokenizer, projection_model):
        self.pipe = loading.pipeline(text_encoder=text_encoder, tokenizer=tokenizer, projection_model=projection_model)

    @torch.no_grad()
    def encode(self, prompt: str, negative_prompt: str | None, *, start: float, end: float,
               cfg: bool) -> tuple[np.ndarray, np.ndarray]:
        """(text_audio_duration_embeds float32 [R, T + 2, D], audio_duration_embeds float32 [R, 1, 2 D]) with
        R = 2 (rows [uncond, cond]) when `cfg` (guidance_scale > 1), else 1; T: the tokenizer's model_max_length.

        With cfg and no negative prompt the uncond row is zeros (the pipeline's rule); with one, it is the
        negative prompt's embeddings (padding tokens zeroed) with the same seconds. start / end: the clip's
        seconds_start and seconds_start + seconds_total.
        """
        pipe = self.pipe
        embeds = pipe.encode_prompt(prompt, "cpu", cfg, negative_prompt)
        start_states, end_states = pipe.encode_duration(start, end, "cpu", cfg and negative_prompt is not None, 1)
        text = torch.cat([embeds, start_states, end_states], dim=1)
        duration = torch.cat([start_states, end_states], dim=2)
        if cfg and negative_prompt is None:
            text = torch.cat([torch.zeros_like(text), text])
            duration = torch.cat([duration, duration])
        return text.float().numpy(), duration.float().numpy()
