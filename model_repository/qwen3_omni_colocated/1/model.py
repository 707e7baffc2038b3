from omni_backends.qwen3_omni.serving.colocated_model import TritonPythonModel  # noqa: F401
