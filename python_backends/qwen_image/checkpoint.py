"""Deterministic tiny random-weight Qwen-Image checkpoint in the layout of a real diffusers one.

`write_checkpoint(OUT_DIR)` (run by `python -m omni_backends.prepare qwen_image`) writes what
`QwenImagePipeline.save_pretrained` writes (model_index.json, scheduler/, text_encoder/, tokenizer/,
transformer/, vae/), plus processor/ (the
`Qwen2VLImageProcessor` the edit pipelines need) and `omni_triton.json` (the prompt-template offsets of the
tiny tokenizer, see `loading`). Sizes follow ../shared notes "models.md §4": transformer 2 layers x 2 heads
x 16, VAE base_dim 8 / z_dim 16 (vae_scale_factor 8, as the real VAE), Qwen2.5-VL text encoder hidden 32.
The tokenizer is the tiny byte-level BPE of `omni_backends.qwen3_omni.tiny_tokenizer` (Qwen specials).
Idempotent: a directory holding the completion marker is left as it is.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from omni_backends.paths import TINY_COMPLETE_MARKER

SEED = 20251201
COMPLETE_MARKER = TINY_COMPLETE_MARKER
TEXT_HIDDEN = 32
# Qwen/Qwen-Image's scheduler_config.json (dynamic shifting, exponential time shift).
SCHEDULER_CONFIG = dict(base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=8192,
                        max_shift=0.9, num_train_timesteps=1000, shift=1.0, shift_terminal=0.02,
                        stochastic_sampling=False, time_shift_type="exponential", use_beta_sigmas=False,
                        use_dynamic_shifting=True, use_exponential_sigmas=False, use_karras_sigmas=False)
# The edit pipelines resize the condition image for the vision encoder; the tiny checkpoint caps its
# pixels so that a CPU encodes it in milliseconds (the real Qwen2VL default is 28*28*1280).
CONDITION_MAX_PIXELS = 128 * 128


def build_components(tok) -> dict:
    """Random-weight components (seeded with SEED; the global RNG state is restored afterwards)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tok.convert_tokens_to_ids
    vocab = (len(tok) + 63) // 64 * 64
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        transformer = QwenImageTransformer2DModel(
            patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
            joint_attention_dim=TEXT_HIDDEN, guidance_embeds=False, axes_dims_rope=(8, 4, 4)).eval()
        vae = AutoencoderKLQwenImage(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=1,
                                     temperal_downsample=[False, True, True], latents_mean=[0.0] * 16,
                                     latents_std=[1.0] * 16).eval()
        config = Qwen2_5_VLConfig(
            text_config=dict(hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=2, vocab_size=vocab, bos_token_id=ids("<|endoftext|>"),
                             eos_token_id=ids("<|im_end|>"),
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=TEXT_HIDDEN,
                               fullatt_block_indexes=[0]),
            vocab_size=vocab, bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
        text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    return dict(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tok,
                scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG))


def write_checkpoint(out_dir: str | os.PathLike) -> Path:
    """Write the tiny checkpoint into `out_dir` (created if missing) unless it is already complete.

    Returns the directory. The completion marker is written last, so an interrupted run is redone.
    """
    from diffusers import QwenImagePipeline
    from transformers import Qwen2VLImageProcessorPil

    from omni_backends.qwen3_omni.tiny_tokenizer import build_tokenizer
    from omni_backends.qwen_image.loading import EDIT_TEMPLATE, T2I_TEMPLATE, OFFSETS_FILE

    out = Path(out_dir)
    if (out / COMPLETE_MARKER).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    QwenImagePipeline(**build_components(tok)).save_pretrained(out)
    Qwen2VLImageProcessorPil(max_pixels=CONDITION_MAX_PIXELS).save_pretrained(out / "processor")
    prefix = lambda text: len(tok(text)["input_ids"])  # noqa: E731 - tokens the pipeline drops
    offsets = {"prompt_template_encode_start_idx": prefix(T2I_TEMPLATE.split("{}")[0]),
               "edit_prompt_template_encode_start_idx": prefix(EDIT_TEMPLATE.split("<|vision_start|>")[0])}
    (out / OFFSETS_FILE).write_text(json.dumps(offsets, indent=1) + "\n")
    (out / COMPLETE_MARKER).write_text("ok\n")
    return out

