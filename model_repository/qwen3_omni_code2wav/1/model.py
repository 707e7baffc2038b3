from omni_backends.qwen3_omni.serving.code2wav_model import TritonPythonModel  # noqa: F401
