from omni_backends.qwen_image.serving.vae_model import TritonPythonModel  # noqa: F401
