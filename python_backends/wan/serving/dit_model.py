"""wan_dit: the Wan transformer(s) as a step-batched denoiser (decoupled engine stage).

Each request is one job (tensors: `protocol`); every iteration of the DenoiseLoop advances all live jobs with
the same latent shape by one step, one forward per expert (Wan2.2's high- and low-noise transformers), and
streams a "step" event per job; the last is "done" with the final latents. In-flight requests
(`omni_inflight_requests`) are the jobs holding or awaiting a batch slot.
"""
from __future__ import annotations

import numpy as np

from omni_backends.diffusion import DenoiseParams
from omni_backends.diffusion.stage import DenoiserStageModel, input_tensor
from omni_backends.errors import RequestError
from omni_backends.serving import events
from omni_backends.wan import loading
from omni_backends.wan.denoiser import WanDenoiser
from omni_backends.wan.serving import protocol as p


class TritonPythonModel(DenoiserStageModel):
    def build_denoiser(self):
        path = p.stage_checkpoint(self.parameters, self.model_name)
        return WanDenoiser(path, loading.component(path, "transformer"), loading.component(path, "transformer_2"),
                           loading.component(path, "scheduler"))

    def make_job(self, request):
        embeds, negative, params = (input_tensor(request, n) for n in (p.EMBEDS, p.NEGATIVE, p.PARAMS))
        if embeds is None or embeds.ndim != 2 or params is None:
            raise RequestError(f"{p.EMBEDS} FP32 [L, D] and {p.PARAMS} are required")
        try:
            spec = events.read_json(params)
            scale_2 = spec.get("guidance_scale_2")
            job = self.denoiser.make_job(
                np.ascontiguousarray(embeds, np.float32),
                None if negative is None else np.ascontiguousarray(negative, np.float32),
                height=int(spec["height"]), width=int(spec["width"]), num_frames=int(spec["num_frames"]),
                steps=int(spec["steps"]), seed=int(spec["seed"]), guidance_scale=float(spec.get("guidance_scale", 1.0)),
                guidance_scale_2=None if scale_2 is None else float(scale_2))
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(f"invalid denoise job: {exc}") from None
        return job, DenoiseParams(latent_steps=frozenset(int(s) for s in spec.get("latent_steps", [])))
