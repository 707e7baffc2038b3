"""voice_tts: speech synthesis of one text chunk, a stateless stage with dynamic batching.

The engine is the config parameter `engine` (omni_backends.voice.engines): `kokoro` (Kokoro-82M, the
default; `checkpoint` names its ONNX directory) or `piper` (Piper, the joe voice from its package).
`threads`: onnxruntime threads of either.
Contract:
  TEXT   BYTES [batch, 1]        text to speak (a sentence or a few; long text is split, never truncated)
  VOICE  BYTES [batch, 1]        voice name or OpenAI alias (optional; default: the engine's, jf_alpha / joe)
  SPEED  FP32  [batch, 1]        0.25-4.0 (optional; default 1.0)
  AUDIO  FP32  [batch, samples]  mono PCM at 24 kHz (rows of a batch are zero-padded to the longest)
  TOKENS INT32 [batch, 1]        the engine's phoneme tokens spoken (usage)
Unknown voice or speed out of range: an error response with the OpenAI envelope (400). A request
abandoned by its caller is dropped, or its synthesis interrupted (BatchStageModel).
"""
from __future__ import annotations

import numpy as np

from omni_backends.paths import resolve_checkpoint
from omni_backends.serving import model_config
from omni_backends.serving.batch_model import BatchStageModel, string
from omni_backends.voice import engines


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        engine = engines.check_engine(self.parameters.get("engine"))
        kokoro_dir = None
        if engine == engines.KOKORO:
            kokoro_dir = resolve_checkpoint(self.parameters["checkpoint"], self.model_name)
        self.tts = engines.load(engine, kokoro_dir, model_config.int_parameter(self.parameters, "threads", 0) or None)

    def infer_row(self, inputs):
        text = string(inputs.get("TEXT"))
        speed = float(inputs["SPEED"].reshape(-1)[0]) if "SPEED" in inputs else 1.0
        voice = string(inputs.get("VOICE")) or None
        pcm = self.tts.synthesize(text, voice=voice, speed=speed, cancel=self.cancel_token)
        tokens = sum(len(chunk) for chunk in self.tts.tokenize(text))
        return {"AUDIO": pcm, "TOKENS": np.array([tokens], dtype=np.int32)}
