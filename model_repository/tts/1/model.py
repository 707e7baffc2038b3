from omni_backends.voice.serving.speech_model import TritonPythonModel  # noqa: F401
