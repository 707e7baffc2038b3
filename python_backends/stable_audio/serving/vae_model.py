"""stable_audio_vae: decode one clip's latents to its waveform (tensors: `protocol`)."""
from __future__ import annotations

import numpy as np

from omni_backends.errors import RequestError
from omni_backends.serving.batch_model import BatchStageModel
from omni_backends.stable_audio import loading
from omni_backends.stable_audio.serving import protocol as p
from omni_backends.stable_audio.vae import StableAudioVAE


class TritonPythonModel(BatchStageModel):
    def setup(self) -> None:
        self.vae = StableAudioVAE(loading.component(p.stage_checkpoint(self.parameters, self.model_name), "vae"))
        self.channels = self.vae.vae.config.decoder_input_channels

    def infer_row(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        latents, seconds = inputs[p.LATENTS], inputs.get(p.SECONDS)
        if latents.ndim != 2 or latents.shape[0] != self.channels or seconds is None or seconds.shape != (2,):
            raise RequestError(f"{p.LATENTS} must be FP32 [{self.channels}, length] and {p.SECONDS} FP64 [2], got "
                               f"{list(latents.shape)}")
        start, end = (float(s) for s in seconds)
        return {p.AUDIO: self.vae.decode(np.ascontiguousarray(latents, np.float32), start, end)}
