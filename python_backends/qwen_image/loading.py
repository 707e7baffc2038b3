"""Loads Qwen-Image components from one diffusers checkpoint directory (the tiny default or a real
Qwen-Image / Qwen-Image-Edit folder) and builds diffusers pipeline objects around them, so that the
stages call the library's own `encode_prompt`, `prepare_latents`, `_encode_vae_image`, `_unpack_latents`.

Each stage loads only its components (`component(path, "transformer")`, ...). A checkpoint may hold
`omni_triton.json` with `prompt_template_encode_start_idx` / `edit_prompt_template_encode_start_idx`: how
many template tokens its tokenizer's prompt prefix has (the pipelines hard-code 34 / 64, the real Qwen
vocabulary's counts; both edit pipelines share the 64); the tiny checkpoint's small tokenizer needs its own.
"""
from __future__ import annotations

import json
from pathlib import Path

OFFSETS_FILE = "omni_triton.json"
T2I_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
                "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                "<|im_start|>assistant\n")
EDIT_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                 "objects, background), then explain how the user's text instruction should alter or modify the "
                 "image. Generate a new image that meets the user's requirements while maintaining consistency with "
                 "the original input where appropriate.<|im_end|>\n<|im_start|>user\n<|vision_start|><|image_pad|>"
                 "<|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n")

_CLASSES = {"transformer": "QwenImageTransformer2DModel", "vae": "AutoencoderKLQwenImage"}
PIPELINES = {"t2i": "QwenImagePipeline", "edit": "QwenImageEditPipeline", "edit_plus": "QwenImageEditPlusPipeline"}


def component(path: str | Path, name: str, dtype: str = "float32"):
    """One component of the checkpoint: "transformer", "vae", "text_encoder" (loaded in `dtype`: float32,
    bfloat16 or float16), "tokenizer", "scheduler" or "processor" (the Qwen2-VL processor of the edit
    pipelines). Raises FileNotFoundError if absent, ValueError for an unknown name or dtype."""
    folder = Path(path) / name
    if name != "processor" and not folder.is_dir():
        raise FileNotFoundError(f"{path} has no {name}/ folder (not a Qwen-Image diffusers checkpoint)")
    if name in _CLASSES:
        import diffusers

        return getattr(diffusers, _CLASSES[name]).from_pretrained(path, subfolder=name,
                                                                 torch_dtype=_dtype(dtype)).eval()
    if name == "text_encoder":
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration.from_pretrained(path, subfolder=name, dtype=_dtype(dtype)).eval()
    if name == "tokenizer":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    if name == "scheduler":
        from diffusers import FlowMatchEulerDiscreteScheduler

        return FlowMatchEulerDiscreteScheduler.from_pretrained(path, subfolder=name)
    if name == "processor":
        return image_only_processor(path)
    raise ValueError(f"unknown Qwen-Image component {name!r}")


def _dtype(name: str):
    import torch

    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {name!r}")
    return getattr(torch, name)


def image_only_processor(path: str | Path):
    """`Qwen2VLProcessor` (image processor from processor/, tokenizer from tokenizer/) without its video
    processor: transformers builds that from torchvision, which cannot load beside torch 2.13 here."""
    from transformers import Qwen2VLImageProcessorPil, Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def check_argument_for_proper_class(self, name, arg):
            if name == "video_processor" and arg is None:
                return None
            return super().check_argument_for_proper_class(name, arg)

    folder = Path(path) / "processor"
    images = Qwen2VLImageProcessorPil.from_pretrained(folder if folder.is_dir() else path)
    return ImageOnlyQwen2VLProcessor(image_processor=images, tokenizer=component(path, "tokenizer"),
                                     video_processor=None)


def offsets(path: str | Path) -> dict[str, int]:
    """The checkpoint's prompt-template offsets (empty for real checkpoints: the pipelines' defaults apply)."""
    file = Path(path) / OFFSETS_FILE
    return json.loads(file.read_text()) if file.exists() else {}


def pipeline(path: str | Path, variant: str = "t2i", **components):
    """A diffusers pipeline holding `components` (missing ones are None) with the checkpoint's template
    offsets applied. variant: "t2i" (`QwenImagePipeline`), "edit" (`QwenImageEditPipeline`, one condition
    image) or "edit_plus" (`QwenImageEditPlusPipeline`, several condition images)."""
    import diffusers

    cls = getattr(diffusers, PIPELINES[variant])
    names = _component_names(variant)
    pipe = cls(**{n: components.get(n) for n in names})
    found = offsets(path)
    key = "prompt_template_encode_start_idx" if variant == "t2i" else "edit_prompt_template_encode_start_idx"
    if key in found:
        pipe.prompt_template_encode_start_idx = found[key]
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _component_names(variant: str) -> list[str]:
    names = ["scheduler", "vae", "text_encoder", "tokenizer", "transformer"]
    return names + (["processor"] if variant != "t2i" else [])


def reference_pipeline(path: str | Path, variant: str = "t2i"):
    """The whole diffusers pipeline on the checkpoint (tests and the in-process benchmark baseline)."""
    names = _component_names(variant)
    return pipeline(path, variant, **{n: component(path, n) for n in names})
