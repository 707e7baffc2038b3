"""Generic diffusion serving machinery, shared by every diffusion family (Qwen-Image, Wan, ...).

- `segments`: bit-exact step-level batching of a diffusers transformer: one forward for rows of many
  requests, with the shape-sensitive kernels (GEMMs, attention) run per request at the shapes the
  library's own pipeline would use, so a batched row equals the unbatched pipeline bit for bit.
- `engine`: `DenoiseJob` (one request's latents, scheduler and conditioning rows), `Denoiser` (the
  family's forward for a group of jobs of one shape bucket) and `DenoiseLoop` (a thread that advances
  every live job one step per iteration, one forward per shape bucket: continuous batching at the step).
- `stage`: `DenoiserStageModel`, the denoiser as a Triton engine stage (one request = one job).
- `orchestrator`: `denoise_steps`, the client-facing side: drive one job step by step with progress,
  partial latents and cancellation (torch-free).
- `tensors`: ragged lists of images / latents as one padded array + sizes.
"""
from omni_backends.diffusion.engine import DenoiseJob, DenoiseLoop, DenoiseParams, Denoiser, StepOutput

__all__ = ["DenoiseJob", "DenoiseLoop", "DenoiseParams", "Denoiser", "StepOutput"]
