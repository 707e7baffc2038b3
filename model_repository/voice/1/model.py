from omni_backends.voice.serving.voice_model import TritonPythonModel  # noqa: F401
