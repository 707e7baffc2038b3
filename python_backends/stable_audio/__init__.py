"""Stable Audio Open text-to-audio stages on diffusers' `StableAudioPipeline` classes.

Modules: `checkpoint` (tiny random checkpoint + CLI), `loading` (components of one diffusers checkpoint
directory, pipeline objects around them), `text` (prompt + seconds -> the DiT's conditioning), `denoiser`
(jobs stepped in batches, omni_backends.diffusion), `vae` (latents -> waveform), `serving/` (the Triton models).
"""
