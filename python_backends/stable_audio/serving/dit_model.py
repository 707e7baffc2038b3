"""stable_audio_dit: the Stable Audio DiT as a step-batched denoiser (decoupled engine stage).

Each request is one job (tensors: `protocol`); every iteration of the DenoiseLoop advances all live jobs by one
step in one forward (every job denoises the DiT's full sample_size latents, so all share it) and streams a
"step" event per job; the last is "done" with the final latents. In-flight requests (`omni_inflight_requests`)
are the jobs holding or awaiting a batch slot.
"""
from __future__ import annotations

import numpy as np

from omni_backends.diffusion import DenoiseParams
from omni_backends.diffusion.stage import DenoiserStageModel, input_tensor
from omni_backends.errors import RequestError
from omni_backends.serving import events
from omni_backends.stable_audio import loading
from omni_backends.stable_audio.denoiser import StableAudioDenoiser
from omni_backends.stable_audio.serving import protocol as p


class TritonPythonModel(DenoiserStageModel):
    def build_denoiser(self):
        path = p.stage_checkpoint(self.parameters, self.model_name)
        return StableAudioDenoiser(loading.component(path, "transformer"), loading.component(path, "scheduler"),
                                   loading.layout(path).channels)

    def make_job(self, request):
        text, duration, params = (input_tensor(request, n) for n in (p.TEXT, p.DURATION, p.PARAMS))
        if text is None or duration is None or params is None:
            raise RequestError(f"{p.TEXT}, {p.DURATION} and {p.PARAMS} are required")
        try:
            spec = events.read_json(params)
            job = self.denoiser.make_job(np.ascontiguousarray(text, np.float32),
                                         np.ascontiguousarray(duration, np.float32), steps=int(spec["steps"]),
                                         seed=int(spec["seed"]), guidance_scale=float(spec.get("guidance_scale", 1.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(f"invalid denoise job: {exc}") from None
        return job, DenoiseParams(latent_steps=frozenset(int(s) for s in spec.get("latent_steps", [])))
