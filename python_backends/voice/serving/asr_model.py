"""voice_asr: Whisper tiny.en transcription, a stateless stage with dynamic batching.

Contract (see omni_frontend.routes.transcriptions):
  AUDIO   FP32 [batch, samples]  mono 16 kHz PCM
  OPTIONS BYTES [batch, 1]       JSON {"language", "prompt", "temperature", "word_timestamps"} (optional)
  RESULT  BYTES [batch, 1]       JSON {"text", "language", "duration", "segments": [{"id", "start", "end",
                                 "text"}], "words": [{"word", "start", "end", "probability"}]}
"""
from __future__ import annotations



from omni_backends.errors import RequestError
from omni_backends.voice.asr import Transcription, WhisperASR
from omni_backends.paths import resolve_checkpoint
from omni_backends.voice.models import prepare_whisper
from omni_backends.serving import events, model_config
from omni_backends.serving.batch_model import BatchStageModel


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        checkpoint = self.parameters.get("checkpoint")
        model_dir = resolve_checkpoint(checkpoint, self.model_name) if checkpoint else prepare_whisper()
        self.asr = WhisperASR(model_dir, cpu_threads=model_config.int_parameter(self.parameters, "threads", 0) or None)

    def infer_row(self, inputs, cancel):
        try:
            options = events.read_json(inputs["OPTIONS"]) if "OPTIONS" in inputs else {}
        except ValueError as exc:
            raise RequestError(f"OPTIONS must be JSON: {exc}", param="OPTIONS") from None
        result = self.asr.transcribe(inputs["AUDIO"], language=options.get("language") or "en",
                                     prompt=options.get("prompt"), temperature=float(options.get("temperature") or 0.0),
                                     word_timestamps=bool(options.get("word_timestamps")), cancel=cancel)
        return {"RESULT": events.json_tensor(result_dict(result))}


def result_dict(result: Transcription) -> dict:
    """The RESULT JSON object of one transcription (times in seconds)."""
    segments = [{"id": i, "start": s.start, "end": s.end, "text": s.text} for i, s in enumerate(result.segments)]
    words = [{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
             for s in result.segments for w in s.words]
    return {"text": result.text, "language": result.language, "duration": result.duration,
            "segments": segments, "words": words}

