"""The denoiser stage's Triton adapter (only imported inside Triton stubs).

`DenoiserStageModel`: the denoiser as an engine stage (decoupled, `max_batch_size: 0`): one request is one
job; `execute` only enqueues it into the `DenoiseLoop` thread, which steps every live job together, and
the EngineStageModel sender thread streams one response per step and polls cancellation (a cancelled job
leaves its batch slot before the next step). Families implement `build_denoiser(path)` and
`make_job(request) -> (DenoiseJob, DenoiseParams)`. The orchestrator side is
`omni_backends.diffusion.orchestrator`.
"""
from __future__ import annotations

import numpy as np

from omni_backends.diffusion.engine import DenoiseJob, DenoiseLoop, DenoiseParams, Denoiser, StepOutput
from omni_backends.diffusion.orchestrator import EVENT, LATENTS
from omni_backends.serving import events, model_config
from omni_backends.serving.engine_model import EngineStageModel


def input_tensor(request, name: str) -> np.ndarray | None:
    """Input `name` of a Triton request as numpy, or None when the client did not send it."""
    import triton_python_backend_utils as pb_utils

    found = pb_utils.get_input_tensor_by_name(request, name)
    return None if found is None else found.as_numpy()

class DenoiserStageModel(EngineStageModel):
    """Config parameter `max_running` (default 16): batch slots; more jobs wait."""

    def build_denoiser(self) -> Denoiser:
        raise NotImplementedError

    def make_job(self, request) -> tuple[DenoiseJob, DenoiseParams]:
        """Parse one Triton request; raise RequestError for bad input."""
        raise NotImplementedError

    def build_loop(self, args):
        self.denoiser = self.build_denoiser()
        return DenoiseLoop(self.denoiser, max_running=model_config.int_parameter(self.parameters, "max_running", 16),
                           name=f"{self.model_name}-loop")

    def make_prompt(self, request):
        job, params = self.make_job(request)
        return job, params, None

    def encode(self, context, output: StepOutput):
        if output.finish_reason in ("abort", "error"):
            return None
        event = {"type": "done" if output.finished else "step", "step": output.step, "total_steps": output.total_steps,
                 "batch_jobs": output.batch_jobs, "batch_rows": output.batch_rows}
        tensors = {EVENT: events.json_tensor(event)}
        if output.latents is not None:
            tensors[LATENTS] = np.ascontiguousarray(output.latents, dtype=np.float32)
        return tensors
