"""stable_audio: the client-facing Stable Audio text-to-audio orchestrator (async BLS, decoupled).

Inputs: REQUEST BYTES [1] JSON {"prompt", "negative_prompt" (default none: with CFG the uncond row is zeros,
StableAudioPipeline's rule), "audio_start" (seconds, default 0), "audio_length" (seconds, default: the
longest clip the checkpoint makes, `audio_start + audio_length` at most that: the DiT denoises that many
seconds and the clip is cut from them), "num_inference_steps", "guidance_scale" (> 1: classifier-free
guidance), "seed" (default random, reported)}; missing fields take the config's defaults; any other key is a
400 `unsupported_parameter` (`request_fields`). Flow: stable_audio_text_encoder (prompt, negative prompt and
seconds -> conditioning rows) -> one denoising job on stable_audio_dit, whose per-step responses become
{"type": "progress", "step", "total_steps", "batch_jobs"} events -> stable_audio_vae decode. Cancelling the
request aborts the job before its next step. Outputs (one response per event): EVENT BYTES [1] + AUDIO FP32
[samples, channels] (empty [0, channels] except for the "audio" event): "progress" ... | {"type": "audio",
"sample_rate", "channels", "samples", "audio_start", "audio_length", "seed"} + AUDIO (the clip, in [-1, 1]
for a trained model: a random-weight one may exceed it). Errors (RequestError, HTTP 400) name the field.
"""
from __future__ import annotations

import random

import numpy as np

from omni_backends.diffusion.fields import MAX_SEED, number
from omni_backends.diffusion.orchestrator import denoise_steps, progress_event
from omni_backends.errors import RequestError
from omni_backends.paths import resolve_checkpoint
from omni_backends.serving import bls, events, model_config
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.stable_audio import loading
from omni_backends.stable_audio.serving import protocol as p

TEXT_ENCODER, DIT, VAE = "stable_audio_text_encoder", "stable_audio_dit", "stable_audio_vae"
REQUEST_FIELDS = ("prompt", "negative_prompt", "audio_start", "audio_length", "num_inference_steps",
                  "guidance_scale", "seed")


class TritonPythonModel(AsyncDecoupledModel):
    request_fields = REQUEST_FIELDS

    def setup(self, args: dict) -> None:
        self.layout = loading.layout(resolve_checkpoint(self.parameters.get("checkpoint") or p.TINY, self.model_name))
        self.no_audio = np.zeros((0, self.layout.channels), np.float32)
        params = self.parameters
        self.steps = model_config.int_parameter(params, "default_steps", 100)
        self.max_steps = model_config.int_parameter(params, "max_steps", 200)
        self.guidance_scale = model_config.float_parameter(params, "default_guidance_scale", 7.0)

    def encode(self, event: dict, audio) -> dict[str, np.ndarray]:
        return {p.EVENT: events.json_tensor(event), p.AUDIO: self.no_audio if audio is None else audio}

    def _request(self, body: dict) -> dict:
        prompt, negative = body.get("prompt"), body.get("negative_prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RequestError("prompt must be a non-empty string", param="prompt")
        if negative is not None and not isinstance(negative, str):
            raise RequestError("negative_prompt must be a string", param="negative_prompt")
        longest = self.layout.max_duration
        start = number(body, "audio_start", 0.0, 0.0, longest, float)
        length = number(body, "audio_length", longest - start, 0.0, longest, float)
        if length <= 0 or start + length > longest:
            raise RequestError(f"audio_length must be > 0 with audio_start + audio_length at most {longest:g} s (the "
                               f"longest clip this model makes), got {length:g} from {start:g} s", param="audio_length",
                               code="invalid_value")
        if self.layout.samples(start, start + length) == 0:
            raise RequestError(f"audio_length {length:g} s is shorter than one sample at {self.layout.sample_rate} Hz",
                               param="audio_length", code="invalid_value")
        seed = body.get("seed")
        return {"prompt": prompt, "negative": negative, "start": start, "end": start + length,
                "steps": number(body, "num_inference_steps", self.steps, 1, self.max_steps),
                "guidance_scale": number(body, "guidance_scale", self.guidance_scale, 0.0, 100.0, float),
                "seed": random.getrandbits(31) if seed is None else number(body, "seed", 0, 0, MAX_SEED)}

    async def handle(self, ctx):
        r = self._request(ctx.body())
        seconds = np.array([[r["start"], r["end"]]], np.float64)   # exact: the clip is cut at int(seconds * rate)
        inputs = {p.PROMPT: np.array([[r["prompt"].encode()]], dtype=np.object_), p.SECONDS: seconds,
                  p.CFG: np.array([[r["guidance_scale"] > 1.0]])}
        if r["negative"] is not None:
            inputs[p.NEGATIVE_PROMPT] = np.array([[r["negative"].encode()]], dtype=np.object_)
        encoded = await bls.infer(ctx, TEXT_ENCODER, inputs, [p.TEXT, p.DURATION])
        ctx.check()
        job = {p.TEXT: encoded[p.TEXT][0], p.DURATION: encoded[p.DURATION][0],
               p.PARAMS: events.json_tensor({"steps": r["steps"], "seed": r["seed"],
                                             "guidance_scale": r["guidance_scale"]})}
        latents = None
        async for event, step_latents in denoise_steps(ctx, DIT, job):
            yield progress_event(event), None
            if event["type"] == "done":
                latents = step_latents
        audio = (await bls.infer(ctx, VAE, {p.LATENTS: latents[None], p.SECONDS: seconds}, [p.AUDIO]))[p.AUDIO][0]
        yield {"type": "audio", "sample_rate": self.layout.sample_rate, "channels": int(audio.shape[0]),
               "samples": int(audio.shape[1]), "audio_start": r["start"], "audio_length": r["end"] - r["start"],
               "seed": r["seed"]}, np.ascontiguousarray(audio.T)
