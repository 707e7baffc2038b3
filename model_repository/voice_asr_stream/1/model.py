from omni_backends.voice.serving.asr_stream_model import TritonPythonModel  # noqa: F401
