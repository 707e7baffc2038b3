from omni_backends.qwen_image.serving.text_encoder_model import TritonPythonModel  # noqa: F401
