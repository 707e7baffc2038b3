"""Framework test model (never a pipeline): voice_asr's contract (AUDIO FP32 [batch, samples] 16 kHz,
OPTIONS JSON -> RESULT JSON) without a model, so the transcription route runs end to end in
framework tests: the text names the sample count, one segment spans the audio."""
from omni_backends.serving import events
from omni_backends.serving.batch_model import BatchStageModel


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        pass

    def infer_row(self, inputs):
        seconds = inputs["AUDIO"].size / 16000
        text = f"{inputs['AUDIO'].size} samples"
        return {"RESULT": events.json_tensor({"text": text, "language": "en", "duration": seconds,
                                              "segments": [{"id": 0, "start": 0.0, "end": seconds, "text": text}],
                                              "words": []})}
