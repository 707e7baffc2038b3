"""qwen_image_dit: the Qwen-Image transformer as a step-batched denoiser (decoupled engine stage).

Each request is one job (tensors: `protocol`); every step of the DenoiseLoop runs one transformer
forward for all live jobs with the same latent shapes (different steps, step counts, CFG, prompt lengths
and n share it) and streams a "step" event per job; the last is "done" with the final latents.
In-flight requests (`omni_inflight_requests`) are the jobs holding or awaiting a batch slot.
"""
from __future__ import annotations

import numpy as np

from omni_backends.diffusion import DenoiseParams
from omni_backends.diffusion.stage import DenoiserStageModel
from omni_backends.diffusion.stage import input_tensor as _tensor
from omni_backends.diffusion.tensors import unpack_ragged
from omni_backends.errors import RequestError
from omni_backends.qwen_image import loading
from omni_backends.qwen_image.denoiser import QwenImageDenoiser
from omni_backends.qwen_image.serving import protocol as p
from omni_backends.serving import events


class TritonPythonModel(DenoiserStageModel):
    def build_denoiser(self):
        path = p.stage_checkpoint(self.parameters, self.model_name)
        transformer = loading.component(path, "transformer", self.parameters.get("dtype") or "float32")
        return QwenImageDenoiser(transformer, loading.component(path, "scheduler"), path)

    def make_job(self, request):
        embeds, params = _tensor(request, p.EMBEDS), _tensor(request, p.PARAMS)
        if embeds is None or embeds.ndim != 2 or params is None:
            raise RequestError(f"{p.EMBEDS} FP32 [L, D] and {p.PARAMS} are required")
        try:
            spec = events.read_json(params)
            job = self.denoiser.make_job(
                np.ascontiguousarray(embeds, np.float32), _optional_float(_tensor(request, p.NEGATIVE)),
                n=int(spec["n"]), height=int(spec["height"]), width=int(spec["width"]), steps=int(spec["steps"]),
                seed=int(spec["seed"]), cfg_scale=float(spec.get("cfg_scale", 1.0)),
                conditions=_conditions(request))
        except (KeyError, TypeError, ValueError) as exc:
            raise RequestError(f"invalid denoise job: {exc}") from None
        return job, DenoiseParams(latent_steps=frozenset(int(s) for s in spec.get("latent_steps", [])))


def _conditions(request) -> list[np.ndarray]:
    padded, sizes = _tensor(request, p.CONDITIONS), _tensor(request, p.CONDITION_SIZES)
    if padded is None:
        return []
    if sizes is None:
        raise ValueError(f"{p.CONDITIONS} needs {p.CONDITION_SIZES}")
    return unpack_ragged(np.ascontiguousarray(padded, np.float32), sizes)


def _optional_float(array: np.ndarray | None) -> np.ndarray | None:
    return None if array is None else np.ascontiguousarray(array, np.float32)
