from omni_backends.stable_audio.serving.vae_model import TritonPythonModel  # noqa: F401
