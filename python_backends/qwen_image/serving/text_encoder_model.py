"""qwen_image_text_encoder: prompt (+ edit condition images) -> prompt embeddings, one prompt per request
(tensors: `protocol`). A prompt longer than the pipelines' 1024 template tokens is truncated by the
tokenizer, as in diffusers."""
from __future__ import annotations

import numpy as np

from omni_backends.diffusion.tensors import unpack_ragged
from omni_backends.errors import RequestError
from omni_backends.qwen_image import loading
from omni_backends.qwen_image.serving import protocol as p
from omni_backends.qwen_image.text import TextEncoder
from omni_backends.serving.batch_model import BatchStageModel, string


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        path = p.stage_checkpoint(self.parameters, self.model_name)
        processor = loading.component(path, "processor") if (path / "processor").is_dir() else None
        dtype = self.parameters.get("dtype") or "float32"
        self.encoder = TextEncoder(path, loading.component(path, "text_encoder", dtype),
                                   loading.component(path, "tokenizer"), processor)

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prompt, images = string(inputs.get(p.PROMPT)), inputs.get(p.IMAGES_IN)
        if images is None:
            return {p.EMBEDS: self.encoder.encode(prompt)}
        if images.ndim != 4 or images.shape[-1] != 3 or p.IMAGE_SIZES not in inputs:
            raise RequestError(f"{p.IMAGES_IN} must be uint8 [K, H, W, 3] with {p.IMAGE_SIZES} INT32 [K, 2]")
        try:
            return {p.EMBEDS: self.encoder.encode(prompt, unpack_ragged(images, inputs[p.IMAGE_SIZES]))}
        except ValueError as exc:   # an image the processor cannot take (e.g. aspect ratio over 200)
            raise RequestError(f"image: {exc}", param="image") from None
