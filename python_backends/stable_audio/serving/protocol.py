"""Tensors between the Stable Audio Triton models (no Triton imports). Every stage reads its checkpoint from
the model-config parameter `checkpoint` (absolute, or relative to $OMNI_MODEL_HOME; default
`stable_audio_tiny`) and sets torch's intra-op threads from `threads`.

stable_audio_text_encoder (max_batch_size 1: each tensor has a leading batch dim of 1)
  in   PROMPT           BYTES [1]             the prompt
       NEGATIVE_PROMPT  BYTES [1]             optional: the negative prompt (absent: CFG's uncond row is zeros)
       SECONDS          FP64 [2]              the clip's (start, end) in seconds
       CFG              BOOL [1]              guidance_scale > 1: two conditioning rows [uncond, cond]
  out  TEXT             FP32 [R, T + 2, D]    text_audio_duration_embeds (StableAudioPipeline.__call__'s)
       DURATION         FP32 [R, 1, 2 D]      audio_duration_embeds; R = 2 with CFG, else 1
stable_audio_dit (decoupled engine stage, max_batch_size 0): one request = one denoising job
  in   TEXT, DURATION                          as stable_audio_text_encoder answers them
       PARAMS           BYTES [1]             JSON {"steps", "seed", "guidance_scale",
                                              "latent_steps": [1-based steps whose latents come back]}
  out  EVENT            BYTES [1]             per step {"type": "step", "step", "total_steps", "batch_jobs",
                                              "batch_rows"}; the last one has "type": "done"
       LATENTS          FP32 [C, L]           latents after the steps in latent_steps and the last
stable_audio_vae (max_batch_size 1)
  in   LATENTS          FP32 [C, L]
       SECONDS          FP64 [2]              -> out AUDIO FP32 [channels, samples] (the clip cut from the waveform)
"""
from __future__ import annotations

PROMPT, NEGATIVE_PROMPT, SECONDS, CFG, TEXT, DURATION, PARAMS, EVENT, LATENTS, AUDIO = (
    "PROMPT", "NEGATIVE_PROMPT", "SECONDS", "CFG", "TEXT", "DURATION", "PARAMS", "EVENT", "LATENTS", "AUDIO")
TINY = "stable_audio_tiny"


def stage_checkpoint(parameters: dict, model_name: str):
    """Sets torch's threads and returns the checkpoint directory (serving.model_config.stage_checkpoint)."""
    from omni_backends.serving import model_config

    return model_config.stage_checkpoint(parameters, model_name, TINY)
