"""omni_kernels: Triton-language GPU kernels, each with a PyTorch reference and a CPU fallback."""
