"""voice_tts: Kokoro-82M synthesis of one text chunk, a stateless stage with dynamic batching.

Contract:
  TEXT   BYTES [batch, 1]        text to speak (a sentence or a few; long text is split, never truncated)
  VOICE  BYTES [batch, 1]        voice name or OpenAI alias (optional; default jf_alpha)
  SPEED  FP32  [batch, 1]        0.25-4.0 (optional; default 1.0)
  AUDIO  FP32  [batch, samples]  mono PCM at 24 kHz (rows of a batch are zero-padded to the longest)
  TOKENS INT32 [batch, 1]        Kokoro phoneme tokens spoken (usage)
Unknown voice or speed out of range: an error response with the OpenAI envelope (400). A request
abandoned by its caller is dropped, or its synthesis interrupted (BatchStageModel).
"""
from __future__ import annotations

import numpy as np

from omni_backends.paths import resolve_checkpoint
from omni_backends.voice.models import kokoro_files
from omni_backends.serving import model_config
from omni_backends.serving.batch_model import BatchStageModel, string
from omni_backends.voice.tts import DEFAULT_VOICE, KokoroTTS


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        files = kokoro_files(resolve_checkpoint(self.parameters["checkpoint"], self.model_name))
        self.tts = KokoroTTS(files, intra_op_num_threads=model_config.int_parameter(self.parameters, "threads", 0) or None)

    def infer_row(self, inputs):
        text = string(inputs.get("TEXT"))
        speed = float(inputs["SPEED"].reshape(-1)[0]) if "SPEED" in inputs else 1.0
        pcm = self.tts.synthesize(text, voice=string(inputs.get("VOICE"), DEFAULT_VOICE), speed=speed,
                                   cancel=self.cancel_token)
        tokens = sum(len(chunk) for chunk in self.tts.tokenize(text))
        return {"AUDIO": pcm, "TOKENS": np.array([tokens], dtype=np.int32)}
