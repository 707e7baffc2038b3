"""wan_text_encoder: prompt -> UMT5 prompt embeddings, one prompt per request (tensors: `protocol`).
Prompts longer than 512 tokens are truncated by the tokenizer, as in diffusers."""
from __future__ import annotations

import numpy as np

from omni_backends.serving.batch_model import BatchStageModel, string
from omni_backends.wan import loading
from omni_backends.wan.serving import protocol as p
from omni_backends.wan.text import WanTextEncoder


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        path = p.stage_checkpoint(self.parameters, self.model_name)
        self.encoder = WanTextEncoder(path, loading.component(path, "text_encoder"), loading.component(path, "tokenizer"))

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {p.EMBEDS: self.encoder.encode(string(inputs.get(p.PROMPT)))}
