from omni_backends.wan.serving.dit_model import TritonPythonModel  # noqa: F401
