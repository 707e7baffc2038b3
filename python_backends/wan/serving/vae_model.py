"""wan_vae: decode one video's latents to uint8 RGB frames (tensors: `protocol`)."""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.serving.batch_model import BatchStageModel
from omni_backends.wan import loading
from omni_backends.wan.serving import protocol as p
from omni_backends.wan.vae import WanVAE


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        path = p.stage_checkpoint(self.parameters, self.model_name)
        self.vae = WanVAE(path, loading.component(path, "vae"))
        self.channels = self.vae.vae.config.z_dim

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        latents = inputs[p.LATENTS]
        if latents.ndim != 4 or latents.shape[0] != self.channels:
            raise RequestError(f"{p.LATENTS} must be FP32 [{self.channels}, frames, height, width], got {latents.shape}")
        return {p.VIDEO: self.vae.decode(np.ascontiguousarray(latents, np.float32))}
