"""qwen_image_vae: decode packed latents to uint8 RGB images, or encode an edit condition image
(tensors: `protocol`). One request decodes all n images of a job in one VAE call, as the pipeline does."""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.qwen_image import loading
from omni_backends.qwen_image.serving import protocol as p
from omni_backends.qwen_image.vae import ImageVAE
from omni_backends.serving.batch_model import BatchStageModel


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        path = p.stage_checkpoint(self.parameters, self.model_name)
        self.vae = ImageVAE(path, loading.component(path, "vae", self.parameters.get("dtype") or "float32"))

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if p.LATENTS in inputs:
            size = inputs.get(p.SIZE)
            if size is None or size.size != 2:
                raise RequestError(f"{p.LATENTS} needs {p.SIZE} = [height, width]")
            return {p.IMAGES: self.vae.decode(np.ascontiguousarray(inputs[p.LATENTS], np.float32),
                                              int(size[0]), int(size[1]))}
        image = inputs.get(p.IMAGE)
        if image is None or image.ndim != 3 or image.shape[-1] != 3:
            raise RequestError(f"send {p.LATENTS} + {p.SIZE} (decode) or {p.IMAGE} uint8 [H, W, 3] (encode)")
        return {p.CONDITION: self.vae.encode_condition(image)}
