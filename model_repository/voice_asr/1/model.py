from omni_backends.voice.serving.asr_model import TritonPythonModel  # noqa: F401
