from omni_backends.stable_audio.serving.audio_model import TritonPythonModel  # noqa: F401
