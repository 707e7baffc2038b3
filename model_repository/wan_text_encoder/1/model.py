from omni_backends.wan.serving.text_encoder_model import TritonPythonModel  # noqa: F401
