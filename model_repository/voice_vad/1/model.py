from omni_backends.voice.serving.vad_model import TritonPythonModel  # noqa: F401
