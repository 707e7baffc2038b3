"""qwen_image_text_encoder: prompt (+ edit condition image) -> prompt embeddings, one prompt per request
(tensors: `protocol`). A prompt longer than the pipelines' 1024 template tokens is truncated by the
tokenizer, as in diffusers."""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.qwen_image import loading
from omni_backends.qwen_image.serving import protocol as p
from omni_backends.qwen_image.text import TextEncoder
from omni_backends.serving.batch_model import BatchStageModel, string


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        path = p.stage_checkpoint(self.parameters, self.model_name)
        processor = loading.component(path, "processor") if (path / "processor").is_dir() else None
        self.encoder = TextEncoder(path, loading.component(path, "text_encoder"), loading.component(path, "tokenizer"),
                                   processor)

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prompt = string(inputs.get(p.PROMPT))
        image = inputs.get(p.IMAGE)
        if image is not None and (image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8):
            raise RequestError(f"{p.IMAGE} must be uint8 [H, W, 3]")
        return {p.EMBEDS: self.encoder.encode(prompt, image)}
