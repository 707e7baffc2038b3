from omni_backends.stable_audio.serving.dit_model import TritonPythonModel  # noqa: F401
