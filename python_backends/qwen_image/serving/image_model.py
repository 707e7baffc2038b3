"""qwen_image / qwen_image_edit: the client-facing Qwen-Image orchestrator (async BLS, decoupled).

Config parameter `task`: "generate" (text-to-image, `QwenImagePipeline`) or "edit" (one image:
`QwenImageEditPipeline`; several: `QwenImageEditPlusPipeline`);
`default_size` ("WxH" used when REQUEST has no width/height; edits default to the input image's size).
Inputs: REQUEST BYTES [1] JSON {"prompt", "negative_prompt", "n" (1-10), "width", "height" (multiples of
16), "num_inference_steps" (1-200, default `default_steps`), "true_cfg_scale" (default 4.0 like the
pipelines; true CFG runs only with a negative_prompt, as there), "seed" (default: random, reported),
"partial_images" (0-3)}, no other non-null key (a 400 naming it: `REQUEST_FIELDS`); edit: INPUT_IMAGES
UINT8 [K, H, W, 3] + INPUT_IMAGE_SIZES INT32 [K, 2] (the images, zero-padded,
`omni_backends.diffusion.tensors.pack_ragged`; the size defaults to the last one's) and optional INPUT_MASK UINT8 [H, W] (alpha of the OpenAI mask over the first image: the edit is kept
where it is 0, the first image elsewhere).
Flow: text encoder (prompt, and the negative prompt concurrently) [+ VAE encode of each condition image]
-> one denoising job on qwen_image_dit, whose per-step responses become {"type": "progress", "step",
"total_steps", "batch_jobs"} events (and partial images: intermediate latents decoded by qwen_image_vae)
-> VAE decode of the final latents. Cancelling the request aborts the job before its next step.
Outputs (one response per event): EVENT BYTES [1] + IMAGE UINT8 [H, W, 3] (empty [0, 0, 3] without an
image): {"type": "progress", ...}, {"type": "image.partial", "index", "partial_image_index"} + IMAGE,
{"type": "image", "index"} + IMAGE (each of the n images), then {"type": "done", "seed", "width",
"height", "usage": {"input_tokens", "input_tokens_details": {"text_tokens", "image_tokens"},
"output_tokens", "total_tokens"}} (tokens: prompt embedding rows, condition and output latent patches).
Errors (RequestError, HTTP 400) name the field.
"""
from __future__ import annotations

import random

import numpy as np
from PIL import Image

from omni_backends.diffusion.orchestrator import denoise_steps, progress_event
from omni_backends.diffusion.tensors import pack_ragged, unpack_ragged
from omni_backends.errors import RequestError
from omni_backends.qwen_image.serving import protocol as p
from omni_backends.serving import bls, events, model_config
from omni_backends.serving.decoupled import AsyncDecoupledModel

TEXT_ENCODER, DIT, VAE = "qwen_image_text_encoder", "qwen_image_dit", "qwen_image_vae"
INPUT_IMAGES, INPUT_IMAGE_SIZES, INPUT_MASK, IMAGE = "INPUT_IMAGES", "INPUT_IMAGE_SIZES", "INPUT_MASK", "IMAGE"
MAX_IMAGES = 4
MULTIPLE = 16                   # vae_scale_factor 8 x 2x2 patches
MAX_PARTIAL_IMAGES = 3
_NO_IMAGE = np.zeros((0, 0, 3), np.uint8)
REQUEST_FIELDS = ("task", "prompt", "negative_prompt", "n", "width", "height", "num_inference_steps", "true_cfg_scale",
                  "seed", "partial_images")
# vLLM-Omni's image fields that Qwen-Image has no use for: what to send instead
FIELD_HINTS = {"guidance_scale": "it is the embedded guidance of guidance-distilled checkpoints, which Qwen-Image is "
                                 "not (diffusers ignores it here); the classifier-free guidance scale is "
                                 "true_cfg_scale, with a negative_prompt"}


def _int(body: dict, name: str, default, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RequestError(f"{name} must be an integer in [{low}, {high}], got {value!r}", param=name)
    return value


def partial_steps(steps: int, count: int) -> list[int]:
    """Steps (1-based, before the last) after which partial images are decoded: `count` spread evenly."""
    return sorted({max(1, round(steps * (i + 1) / (count + 1))) for i in range(count)} - {steps})


class TritonPythonModel(AsyncDecoupledModel):
    request_fields, field_hints = REQUEST_FIELDS, FIELD_HINTS

    def setup(self, args: dict) -> None:
        self.task = self.parameters.get("task") or "generate"
        width, _, height = (self.parameters.get("default_size") or "1024x1024").partition("x")
        self.default_size = (int(width), int(height))
        self.default_steps = model_config.int_parameter(self.parameters, "default_steps", 50)
        self.max_pixels = model_config.int_parameter(self.parameters, "max_pixels", 2048 * 2048)

    def encode(self, event: dict, image) -> dict[str, np.ndarray]:
        return {"EVENT": events.json_tensor(event), IMAGE: _NO_IMAGE if image is None else image}

    def _request(self, ctx) -> dict:
        body = ctx.body()
        task = body.get("task", self.task)
        if task != self.task:
            raise RequestError(f"model {self.model_name} serves task '{self.task}', not '{task}'", param="model")
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RequestError("prompt must be a non-empty string", param="prompt")
        negative = body.get("negative_prompt")
        if negative is not None and not isinstance(negative, str):
            raise RequestError("negative_prompt must be a string", param="negative_prompt")
        cfg = body.get("true_cfg_scale", 4.0)
        if not isinstance(cfg, (int, float)) or isinstance(cfg, bool) or not 0 <= cfg <= 50:
            raise RequestError("true_cfg_scale must be a number in [0, 50]", param="true_cfg_scale")
        images = self._images(ctx)
        default = (images[-1].shape[1], images[-1].shape[0]) if images else self.default_size
        width = _int(body, "width", default[0] // MULTIPLE * MULTIPLE, MULTIPLE, 16384)
        height = _int(body, "height", default[1] // MULTIPLE * MULTIPLE, MULTIPLE, 16384)
        if width % MULTIPLE or height % MULTIPLE or width * height > self.max_pixels:
            raise RequestError(f"size {width}x{height} must be multiples of {MULTIPLE} with at most "
                               f"{self.max_pixels} pixels", param="size")
        seed = body.get("seed")
        if seed is None:
            seed = random.getrandbits(63)
        elif not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 63:
            raise RequestError("seed must be an integer in [0, 2^63)", param="seed")
        mask = ctx.input(INPUT_MASK)
        if mask is not None and (not images or mask.shape != images[0].shape[:2]):
            raise RequestError("INPUT_MASK must be uint8 [H, W] of the first image's size", param="mask")
        return {"prompt": prompt, "negative": negative, "cfg": float(cfg), "images": images, "mask": mask,
                "n": _int(body, "n", 1, 1, 10), "width": width, "height": height, "seed": seed,
                "steps": _int(body, "num_inference_steps", self.default_steps, 1, 200),
                "partials": _int(body, "partial_images", 0, 0, MAX_PARTIAL_IMAGES)}

    def _images(self, ctx) -> list[np.ndarray]:
        padded, sizes = ctx.input(INPUT_IMAGES), ctx.input(INPUT_IMAGE_SIZES)
        if self.task != "edit":
            if padded is not None:
                raise RequestError(f"model {self.model_name} generates from text only", param="image")
            return []
        if padded is None or sizes is None or padded.ndim != 4 or not 1 <= len(padded) <= MAX_IMAGES:
            raise RequestError(f"an edit needs 1-{MAX_IMAGES} images (INPUT_IMAGES uint8 [K, H, W, 3] + "
                               "INPUT_IMAGE_SIZES int32 [K, 2])", param="image")
        try:
            return unpack_ragged(padded, sizes)
        except ValueError as exc:
            raise RequestError(str(exc), param="image") from None

    async def _encode_text(self, ctx, prompt: str, images: list[np.ndarray]) -> np.ndarray:
        inputs = {p.PROMPT: np.array([[prompt.encode()]], dtype=np.object_)}
        if images:
            padded, sizes = pack_ragged(images)
            inputs[p.IMAGES_IN], inputs[p.IMAGE_SIZES] = padded[None], sizes[None]
        return (await bls.infer(ctx, TEXT_ENCODER, inputs, [p.EMBEDS]))[p.EMBEDS][0]

    async def _decode(self, ctx, latents: np.ndarray, r: dict) -> np.ndarray:
        size = np.array([[r["height"], r["width"]]], dtype=np.int32)
        return (await bls.infer(ctx, VAE, {p.LATENTS: latents[None], p.SIZE: size}, [p.IMAGES]))[p.IMAGES][0]

    async def handle(self, ctx):
        r = self._request(ctx)
        cfg = r["cfg"] > 1 and r["negative"] is not None  # the pipelines' rule for true CFG
        work = [self._encode_text(ctx, r["prompt"], r["images"])]
        if cfg:
            work.append(self._encode_text(ctx, r["negative"], r["images"]))
        work += [bls.infer(ctx, VAE, {p.IMAGE: image[None]}, [p.CONDITION]) for image in r["images"]]
        results = await bls.gather(*work)
        ctx.check()
        embeds = results[0]
        inputs = {p.EMBEDS: embeds}
        if cfg:
            inputs[p.NEGATIVE] = results[1]
        conditions = [found[p.CONDITION][0] for found in results[2 if cfg else 1:]]
        condition_tokens = sum(c.shape[-1] * c.shape[-2] // 4 for c in conditions)
        if conditions:
            inputs[p.CONDITIONS], inputs[p.CONDITION_SIZES] = pack_ragged(conditions)
        partial = partial_steps(r["steps"], r["partials"])
        spec = {"n": r["n"], "height": r["height"], "width": r["width"], "steps": r["steps"], "seed": r["seed"],
                "cfg_scale": r["cfg"] if cfg else 1.0, "latent_steps": partial}
        inputs[p.PARAMS] = events.json_tensor(spec)
        final = None
        async for event, latents in denoise_steps(ctx, DIT, inputs):
            yield progress_event(event), None
            if event["type"] == "done":
                final = latents
            elif latents is not None:
                images = await self._decode(ctx, latents, r)
                for index, image in enumerate(images):
                    yield {"type": "image.partial", "index": index,
                           "partial_image_index": partial.index(event["step"])}, self._composite(image, r)
        for index, image in enumerate(await self._decode(ctx, final, r)):
            yield {"type": "image", "index": index}, self._composite(image, r)
        text_tokens = embeds.shape[0] + (results[1].shape[0] if cfg else 0)
        output_tokens = r["n"] * (r["width"] // MULTIPLE) * (r["height"] // MULTIPLE)
        yield {"type": "done", "seed": r["seed"], "width": r["width"], "height": r["height"],
               "usage": {"input_tokens": text_tokens + condition_tokens,
                         "input_tokens_details": {"text_tokens": text_tokens, "image_tokens": condition_tokens},
                         "output_tokens": output_tokens,
                         "total_tokens": text_tokens + condition_tokens + output_tokens}}, None

    @staticmethod
    def _composite(image: np.ndarray, r: dict) -> np.ndarray:
        """With an edit mask: the generated pixels where the mask is transparent, the first image elsewhere."""
        mask = r["mask"]
        if mask is None:
            return image
        size = (image.shape[1], image.shape[0])
        keep = np.asarray(Image.fromarray(mask).resize(size, Image.NEAREST)) > 0
        source = np.asarray(Image.fromarray(r["images"][0]).resize(size, Image.BICUBIC))
        return np.where(keep[..., None], source, image)
