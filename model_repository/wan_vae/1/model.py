from omni_backends.wan.serving.vae_model import TritonPythonModel  # noqa: F401
