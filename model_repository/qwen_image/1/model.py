from omni_backends.qwen_image.serving.image_model import TritonPythonModel  # noqa: F401
