from omni_backends.qwen3_omni.serving.talker_model import TritonPythonModel  # noqa: F401
