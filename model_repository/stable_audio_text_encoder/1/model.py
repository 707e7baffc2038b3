from omni_backends.stable_audio.serving.text_encoder_model import TritonPythonModel  # noqa: F401
