"""Qwen-Image text-to-image and edit stages on diffusers' `QwenImage*` classes.

Modules: `checkpoint` (tiny random checkpoint + CLI), `loading` (components of one diffusers checkpoint
directory, pipeline objects around them), `text` (prompt -> embeddings, edit condition image), `denoiser`
(jobs stepped in batches, omni_backends.diffusion), `vae` (latents -> uint8 images, condition image ->
latents), `serving/` (the Triton models).
"""
