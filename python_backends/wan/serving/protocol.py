"""Tensors between the Wan Triton models (no Triton imports). Every stage reads its checkpoint from the
model-config parameter `checkpoint` (absolute, or relative to $OMNI_MODEL_HOME; default `wan_tiny`) and sets
torch's intra-op threads from `threads`.

wan_text_encoder (max_batch_size 1: each tensor has a leading batch dim of 1)
  in   PROMPT     BYTES [1]            the prompt (or negative prompt)
  out  EMBEDS     FP32 [512, D]        prompt embeddings (WanPipeline._get_t5_prompt_embeds, zero-padded)
wan_dit (decoupled engine stage, max_batch_size 0): one request = one denoising job
  in   EMBEDS     FP32 [L, D]
       NEGATIVE   FP32 [L2, D]         optional: negative prompt embeddings (used when guidance_scale > 1)
       PARAMS     BYTES [1]            JSON {"height", "width", "num_frames", "steps", "seed",
                                       "guidance_scale", "guidance_scale_2" (null: guidance_scale),
                                       "latent_steps": [1-based steps whose latents come back]}
  out  EVENT      BYTES [1]            per step {"type": "step", "step", "total_steps", "batch_jobs",
                                       "batch_rows"}; the last one has "type": "done"
       LATENTS    FP32 [C, F', h, w]   latents after the steps in latent_steps and the last
wan_vae (max_batch_size 1)
  in   LATENTS    FP32 [C, F', h, w]   -> out VIDEO UINT8 [F, H, W, 3]
"""
from __future__ import annotations

PROMPT, EMBEDS, NEGATIVE, PARAMS, EVENT, LATENTS, VIDEO = (
    "PROMPT", "EMBEDS", "NEGATIVE", "PARAMS", "EVENT", "LATENTS", "VIDEO")
TINY = "wan_tiny"


def stage_checkpoint(parameters: dict, model_name: str):
    """Sets torch's threads (`threads`, default 1) and returns the checkpoint directory. Raises
    FileNotFoundError naming the model and the path."""
    from omni_backends.serving import model_config

    return model_config.stage_checkpoint(parameters, model_name, TINY)
