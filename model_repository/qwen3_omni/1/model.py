from omni_backends.qwen3_omni.serving.omni_model import TritonPythonModel  # noqa: F401
