"""Deterministic tiny random-weight Stable Audio Open checkpoint in the diffusers layout of a real one.

`python -m omni_backends.stable_audio.checkpoint OUT_DIR` writes what `StableAudioPipeline.save_pretrained`
writes for stable-audio-open-1.0: model_index.json, `tokenizer/` (a T5-style Unigram tokenizer trained here,
`omni_backends.wan.checkpoint.build_tokenizer`, cut at MAX_TEXT_TOKENS), `text_encoder/` (`T5EncoderModel`),
`projection_model/` (`StableAudioProjectionModel`: text projection and the seconds_start / seconds_total
number conditioners, 0-512 s as the real one), `transformer/` (`StableAudioDiTModel`), `vae/`
(`AutoencoderOobleck`, stereo at 44.1 kHz, 128x compression instead of 2048x) and `scheduler/`
(`CosineDPMSolverMultistepScheduler` with the real one's defaults). The DiT covers SAMPLE_SIZE latents,
so the longest clip is SAMPLE_SIZE * 128 / 44100 = 0.743 s (47.55 s for the real model). The DiT's widths are
multiples of 32 for the reason `omni_backends.wan.checkpoint` gives (bit-equal step batching). Idempotent: a
directory whose completion marker names this recipe's VERSION is left as it is.
"""
from __future__ import annotations

import os
from pathlib import Path

from omni_backends.diffusion.checkpoint import tiny_cli, write_tiny

SEED = 20260412
VERSION = "tiny random Stable Audio Open checkpoint v1 (omni_backends.stable_audio.checkpoint)\n"  # bump on change
TEXT_DIM, CONDITIONING_DIM, LATENT_CHANNELS = 32, 64, 32
MAX_TEXT_TOKENS = 32
SAMPLE_SIZE = 256


def build_pipeline():
    """The tiny `StableAudioPipeline` (random weights drawn under SEED)."""
    import torch  # imported here: a launch that finds the checkpoint written imports no torch
    from diffusers import (AutoencoderOobleck, CosineDPMSolverMultistepScheduler, StableAudioDiTModel,
                           StableAudioPipeline, StableAudioProjectionModel)
    from transformers import T5Config, T5EncoderModel

    from omni_backends.wan.checkpoint import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.model_max_length = MAX_TEXT_TOKENS
    torch.manual_seed(SEED)
    text_encoder = T5EncoderModel(T5Config(
        vocab_size=len(tokenizer), d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)).eval()
    projection = StableAudioProjectionModel(text_encoder_dim=TEXT_DIM, conditioning_dim=CONDITIONING_DIM,
                                            min_value=0, max_value=512)
    transformer = StableAudioDiTModel(
        sample_size=SAMPLE_SIZE, in_channels=LATENT_CHANNELS, num_layers=2, attention_head_dim=32,
        num_attention_heads=2, num_key_value_attention_heads=1, out_channels=LATENT_CHANNELS,
        cross_attention_dim=64, time_proj_dim=64, global_states_input_dim=2 * CONDITIONING_DIM,
        cross_attention_input_dim=CONDITIONING_DIM)
    vae = AutoencoderOobleck(encoder_hidden_size=8, downsampling_ratios=[4, 4, 8], channel_multiples=[1, 2, 4],
                             decoder_channels=8, decoder_input_channels=LATENT_CHANNELS, audio_channels=2,
                             sampling_rate=44100)
    return StableAudioPipeline(vae=vae, text_encoder=text_encoder, projection_model=projection, tokenizer=tokenizer,
                               transformer=transformer, scheduler=CosineDPMSolverMultistepScheduler())


def write_checkpoint(out_dir: str | os.PathLike) -> Path:
    """Writes the checkpoint into `out_dir` (omni_backends.diffusion.checkpoint.write_tiny); returns the path."""
    return write_tiny(out_dir, VERSION, lambda folder: build_pipeline().save_pretrained(folder))


if __name__ == "__main__":
    tiny_cli(__doc__, write_checkpoint)
