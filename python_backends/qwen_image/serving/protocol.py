"""Tensors between the Qwen-Image Triton models (no Triton imports). Every stage reads its checkpoint
from the model-config parameter `checkpoint` (absolute, or relative to $OMNI_MODEL_HOME; default
`qwen_image_tiny`), loads its component in `dtype` (float32 default; bfloat16 / float16 for real
checkpoints: latents and embeddings then travel as float32 and are cast back) and sets torch's intra-op
threads from `threads` (0: torch's default).

qwen_image_text_encoder (max_batch_size 1: each tensor has a leading batch dim of 1)
  in   PROMPT       BYTES [1]         the prompt (or negative prompt)
       IMAGES       UINT8 [K, H, W, 3] optional: the edit's condition images, zero-padded to the largest
       IMAGE_SIZES  INT32 [K, 2]      (height, width) of each (omni_backends.diffusion.tensors.pack_ragged)
  out  EMBEDS       FP32 [L, D]       prompt embeddings (QwenImage / Edit (K = 1) / EditPlus (K > 1)
                                      Pipeline.encode_prompt)
qwen_image_dit (decoupled engine stage, max_batch_size 0): one request = one denoising job
  in   EMBEDS       FP32 [L, D]
       NEGATIVE     FP32 [L2, D]      optional: negative prompt embeddings (used when cfg_scale > 1)
       CONDITIONS   FP32 [K, 16, 1, h, w] optional: edit condition latents (qwen_image_vae), zero-padded
       CONDITION_SIZES INT32 [K, 2]   (h, w) of each
       PARAMS       BYTES [1]         JSON {"n", "height", "width", "steps", "seed", "cfg_scale",
                                      "latent_steps": [1-based steps whose latents come back]}
  out  EVENT        BYTES [1]         per step {"type": "step", "step", "total_steps", "batch_jobs",
                                      "batch_rows"}; the last one has "type": "done"
       LATENTS      FP32 [n, S, 64]   packed latents after the steps in latent_steps and the last
qwen_image_vae (max_batch_size 1)
  decode  in LATENTS FP32 [n, S, 64] + SIZE INT32 [2] (height, width) -> out IMAGES UINT8 [n, H, W, 3]
  encode  in IMAGE UINT8 [H, W, 3]                                   -> out CONDITION FP32 [16, 1, h, w]
"""
from __future__ import annotations

PROMPT, IMAGE, EMBEDS, NEGATIVE, CONDITION = "PROMPT", "IMAGE", "EMBEDS", "NEGATIVE", "CONDITION"
IMAGES_IN, IMAGE_SIZES, CONDITIONS, CONDITION_SIZES = "IMAGES", "IMAGE_SIZES", "CONDITIONS", "CONDITION_SIZES"
PARAMS, EVENT, LATENTS, SIZE, IMAGES = "PARAMS", "EVENT", "LATENTS", "SIZE", "IMAGES"
TINY = "qwen_image_tiny"


def stage_checkpoint(parameters: dict, model_name: str):
    """Sets torch's intra-op threads and returns the checkpoint directory (`model_config.stage_checkpoint`)."""
    from omni_backends.serving import model_config

    return model_config.stage_checkpoint(parameters, model_name, TINY)
