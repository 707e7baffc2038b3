"""omni_backends: stage implementations served by Triton's Python backend.

Plain Python classes (engines, codecs, model loading) testable without a server, plus thin Triton
adapters in `omni_backends.triton` that `model_repository/<model>/1/model.py` shims import.
"""
