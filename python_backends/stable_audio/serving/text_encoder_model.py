"""stable_audio_text_encoder: prompt, negative prompt and seconds -> the DiT's conditioning rows, one request
at a time (tensors: `protocol`). Prompts longer than the tokenizer's model_max_length are truncated, as in
diffusers."""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.serving.batch_model import BatchStageModel, string
from omni_backends.stable_audio import loading
from omni_backends.stable_audio.serving import protocol as p
from omni_backends.stable_audio.text import StableAudioConditioner


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        path = p.stage_checkpoint(self.parameters, self.model_name)
        self.conditioner = StableAudioConditioner(*(loading.component(path, n)
                                                    for n in ("text_encoder", "tokenizer", "projection_model")))

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seconds, cfg = inputs.get(p.SECONDS), inputs.get(p.CFG)
        if seconds is None or seconds.shape != (2,) or cfg is None:
            raise RequestError(f"{p.SECONDS} FP64 [2] and {p.CFG} BOOL [1] are required")
        negative = inputs.get(p.NEGATIVE_PROMPT)
        text, duration = self.conditioner.encode(string(inputs.get(p.PROMPT)),
                                                 None if negative is None else string(negative),
                                                 start=float(seconds[0]), end=float(seconds[1]),
                                                 cfg=bool(cfg.reshape(-1)[0]))
        return {p.TEXT: text, p.DURATION: duration}
