"""wan: the client-facing Wan text-to-video orchestrator (async BLS, decoupled).

Inputs: REQUEST BYTES [1] JSON {"prompt", "negative_prompt" (default ""), "width", "height" (multiples of the
checkpoint's size grid, 16 for Wan2.1/2.2-A14B VAEs), "num_frames" (4k+1), "fps" (only reported: the frames do
not depend on it), "num_inference_steps", "guidance_scale" (> 1: classifier-free guidance with the negative
prompt, as in WanPipeline), "guidance_scale_2" (Wan2.2's low-noise expert; default guidance_scale), "seed"
(default random, reported)}; missing fields take the config's defaults. {"action": "describe"} answers one
"describe" event with those defaults and the limits (what the frontend validates against).
Flow: wan_text_encoder (prompt, and the negative prompt concurrently) -> one denoising job on wan_dit, whose
per-step responses become {"type": "progress", "step", "total_steps", "batch_jobs"} events -> wan_vae decode.
Cancelling the request aborts the job before its next step. Outputs (one response per event): EVENT BYTES [1]
+ VIDEO UINT8 [F, H, W, 3] (empty [0, 0, 0, 3] except for the "video" event): "describe" | "progress" ... |
{"type": "video", "num_frames", "width", "height", "fps", "seed"} + VIDEO (RGB frames).
Errors (RequestError, HTTP 400) name the field; INPUT_IMAGE (image-to-video) is refused with 400 because
this pipeline serves text-to-video checkpoints.
"""
from __future__ import annotations

import random

import numpy as np

from omni_backends.diffusion.fields import MAX_SEED, number as _number
from omni_backends.diffusion.orchestrator import denoise_steps, progress_event
from omni_backends.errors import RequestError
from omni_backends.paths import resolve_checkpoint
from omni_backends.serving import bls, events, model_config
from omni_backends.serving.decoupled import AsyncDecoupledModel
from omni_backends.wan import loading
from omni_backends.wan.serving import protocol as p

TEXT_ENCODER, DIT, VAE = "wan_text_encoder", "wan_dit", "wan_vae"
INPUT_IMAGE = "INPUT_IMAGE"
_NO_VIDEO = np.zeros((0, 0, 0, 3), np.uint8)


class TritonPythonModel(AsyncDecoupledModel):
    def setup(self, args: dict) -> None:
        self.layout = loading.layout(resolve_checkpoint(self.parameters.get("checkpoint") or p.TINY, self.model_name))
        if self.layout.pipeline != loading.TEXT_TO_VIDEO or self.layout.expand_timesteps:
            raise ValueError(f"{self.model_name}: only Wan text-to-video checkpoints (WanPipeline without "
                             f"expand_timesteps) are served, not {self.layout.pipeline}")
        params, number = self.parameters, model_config.int_parameter
        width, _, height = (params.get("default_size") or "832x480").partition("x")
        self.defaults = {"size": f"{int(width)}x{int(height)}", "seconds": params.get("default_seconds") or "5",
                         "fps": number(params, "default_fps", 16),
                         "num_inference_steps": number(params, "default_steps", 40),
                         "guidance_scale": model_config.float_parameter(params, "default_guidance_scale", 4.0),
                         "guidance_scale_2": model_config.float_parameter(params, "default_guidance_scale_2", None),
                         "negative_prompt": params.get("default_negative_prompt") or ""}
        self.limits = {"size_multiple": self.layout.size_multiple, "frame_step": self.layout.scale_temporal,
                       "max_width": number(params, "max_width", 1280), "max_height": number(params, "max_height", 1280),
                       "max_frames": number(params, "max_frames", 121),
                       "max_inference_steps": number(params, "max_steps", 200),
                       "max_reference_pixels": number(params, "max_reference_pixels", 4096 * 4096)}

    def encode(self, event: dict, video) -> dict[str, np.ndarray]:
        return {p.EVENT: events.json_tensor(event), p.VIDEO: _NO_VIDEO if video is None else video}

    def _request(self, ctx, body: dict) -> dict:
        if ctx.input(INPUT_IMAGE) is not None:
            raise RequestError(f"{self.model_name} generates video from text only: its checkpoint has no "
                               f"image-to-video support, so input_reference cannot be used", param="input_reference",
                               code="unsupported_parameter")
        prompt, negative = body.get("prompt"), body.get("negative_prompt", self.defaults["negative_prompt"])
        if not isinstance(prompt, str) or not prompt.strip():
            raise RequestError("prompt must be a non-empty string", param="prompt")
        if not isinstance(negative, str):
            raise RequestError("negative_prompt must be a string", param="negative_prompt")
        limits, multiple, step = self.limits, self.limits["size_multiple"], self.limits["frame_step"]
        default_w, default_h = (int(v) for v in self.defaults["size"].split("x"))
        width = _number(body, "width", default_w, multiple, limits["max_width"])
        height = _number(body, "height", default_h, multiple, limits["max_height"])
        if width % multiple or height % multiple:
            raise RequestError(f"width and height must be multiples of {multiple}, got {width}x{height}", param="size")
        fps = _number(body, "fps", self.defaults["fps"], 1, 120)
        default_frames = round(float(self.defaults["seconds"]) * fps / step) * step + 1
        frames = _number(body, "num_frames", default_frames, 1, limits["max_frames"])
        if (frames - 1) % step:
            raise RequestError(f"num_frames must be {step}k+1, got {frames}", param="num_frames")
        scale = _number(body, "guidance_scale", self.defaults["guidance_scale"], 0.0, 100.0, float)
        scale_2 = _number(body, "guidance_scale_2", self.defaults["guidance_scale_2"], 0.0, 100.0, float)
        seed = body.get("seed")
        seed = random.getrandbits(31) if seed is None else _number(body, "seed", 0, 0, MAX_SEED)
        return {"prompt": prompt, "negative": negative, "width": width, "height": height, "num_frames": frames,
                "fps": fps, "steps": _number(body, "num_inference_steps", self.defaults["num_inference_steps"], 1,
                                             limits["max_inference_steps"]),
                "guidance_scale": scale, "guidance_scale_2": scale_2, "seed": seed}

    async def _encode_text(self, ctx, prompt: str) -> np.ndarray:
        return (await bls.infer(ctx, TEXT_ENCODER, {p.PROMPT: np.array([[prompt.encode()]], dtype=np.object_)},
                                [p.EMBEDS]))[p.EMBEDS][0]

    async def handle(self, ctx):
        body = ctx.body()
        if body.get("action") == "describe":
            yield {"type": "describe", "defaults": self.defaults, "limits": self.limits, "image_to_video": False}, None
            return
        r = self._request(ctx, body)
        cfg = r["guidance_scale"] > 1.0  # WanPipeline's rule: CFG with the negative prompt ("" by default)
        encoded = await bls.gather(self._encode_text(ctx, r["prompt"]),
                                    *([self._encode_text(ctx, r["negative"])] if cfg else []))
        ctx.check()
        inputs = {p.EMBEDS: encoded[0]}
        if cfg:
            inputs[p.NEGATIVE] = encoded[1]
        inputs[p.PARAMS] = events.json_tensor({
            "height": r["height"], "width": r["width"], "num_frames": r["num_frames"], "steps": r["steps"],
            "seed": r["seed"], "guidance_scale": r["guidance_scale"], "guidance_scale_2": r["guidance_scale_2"]})
        latents = None
        async for event, step_latents in denoise_steps(ctx, DIT, inputs):
            yield progress_event(event), None
            if event["type"] == "done":
                latents = step_latents
        video = (await bls.infer(ctx, VAE, {p.LATENTS: latents[None]}, [p.VIDEO]))[p.VIDEO][0]
        yield {"type": "video", "num_frames": int(video.shape[0]), "width": r["width"], "height": r["height"],
               "fps": r["fps"], "seed": r["seed"]}, video
