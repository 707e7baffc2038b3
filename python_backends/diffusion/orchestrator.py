"""The orchestrator side of diffusion serving (torch-free: a client-facing model imports only numpy).

`denoise_steps` drives one job through a denoiser stage (`diffusion.stage.DenoiserStageModel`) with a
streamed BLS call and yields each step's event and latents, so the orchestrator can emit progress and
partial images per step; when its client cancels, leaving the stream cancels the job, which frees its
batch slot before the next step.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np

from omni_backends.serving import bls, events

EVENT, LATENTS = "EVENT", "LATENTS"


def progress_event(step_event: dict) -> dict:
    """The client-facing {"type": "progress", "step", "total_steps", "batch_jobs"} event of a denoiser step."""
    return {"type": "progress", "step": step_event["step"], "total_steps": step_event["total_steps"],
            "batch_jobs": step_event["batch_jobs"]}


async def denoise_steps(ctx, model: str,
                        inputs: dict[str, np.ndarray]) -> AsyncIterator[tuple[dict, np.ndarray | None]]:
    """(step event, latents or None) for each step of one job on denoiser `model`; ends after the "done"
    event. Raises Cancelled when the client cancels (the job is aborted), RequestError / StageError."""
    async for response in bls.stream(ctx, model, inputs, [EVENT, LATENTS]):
        event = events.read_json(response[EVENT])
        yield event, response.get(LATENTS)
        if event["type"] == "done":
            return
    raise RuntimeError(f"{model} ended the job without a done event")
