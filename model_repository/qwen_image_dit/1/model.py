from omni_backends.qwen_image.serving.dit_model import TritonPythonModel  # noqa: F401
