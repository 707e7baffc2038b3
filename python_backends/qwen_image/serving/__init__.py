"""Triton Python-backend adapters of the Qwen-Image stages (only imported inside Triton stubs).

`protocol` (tensor names, shared settings), `text_encoder_model`, `dit_model` (the denoiser as an engine
stage with step-level batching), `vae_model`, `image_model` (the client-facing orchestrator).
"""
