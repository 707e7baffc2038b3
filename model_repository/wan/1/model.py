from omni_backends.wan.serving.video_model import TritonPythonModel  # noqa: F401
