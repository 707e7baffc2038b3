from omni_backends.voice.serving.llm_model import TritonPythonModel  # noqa: F401
