from omni_backends.voice.serving.tts_model import TritonPythonModel  # noqa: F401
