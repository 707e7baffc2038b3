from omni_backends.qwen3_omni.serving.thinker_model import TritonPythonModel  # noqa: F401
