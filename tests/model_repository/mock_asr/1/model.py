"""Framework test model (never a pipeline): voice_asr's contract (AUDIO FP32 [batch, samples] 16 kHz,
OPTIONS JSON -> RESULT JSON) without a model, so the transcription route runs end to end in
framework tests: the text names the sample count (and "concurrently" when the row ran alongside
others: two rows of a batch at a time, like voice_asr), one segment spans the audio. The prompt
"sleep S" makes a row take S seconds; "fail" makes it a bad request (error param "prompt")."""
import time

from omni_backends.errors import RequestError
from omni_backends.serving import events
from omni_backends.serving.batch_model import BatchStageModel


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        self.row_workers = 2

    def infer_row(self, inputs):
        prompt = (events.read_json(inputs["OPTIONS"]) if "OPTIONS" in inputs else {}).get("prompt") or ""
        if prompt == "fail":
            raise RequestError("mock_asr was asked to fail", param="prompt")
        if prompt.startswith("sleep "):
            time.sleep(float(prompt.split()[1]))
        seconds = inputs["AUDIO"].size / 16000
        text = f"{inputs['AUDIO'].size} samples" + (" concurrently" if self.concurrent else "")
        return {"RESULT": events.json_tensor({"text": text, "language": "en", "duration": seconds,
                                              "segments": [{"id": 0, "start": 0.0, "end": seconds, "text": text}],
                                              "words": []})}
