"""Loads Wan components from one diffusers checkpoint directory (the tiny default, or a real Wan2.1 / Wan2.2
`*-Diffusers` folder) and builds diffusers `WanPipeline` objects around them, so that the stages call the
library's own `_get_t5_prompt_embeds`, `prepare_latents` and `VideoProcessor`.

Each stage loads only its components (`component(path, "transformer")`, ...); `layout(path)` reads what the
others need to know from the JSON configs alone (no weights).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omni_backends.diffusion.checkpoint import load_component, read_config

_CLASSES = {"transformer": "diffusers.WanTransformer3DModel", "transformer_2": "diffusers.WanTransformer3DModel",
            "vae": "diffusers.AutoencoderKLWan", "text_encoder": "transformers.UMT5EncoderModel"}
TEXT_TO_VIDEO, IMAGE_TO_VIDEO = "WanPipeline", "WanImageToVideoPipeline"


@dataclasses.dataclass(frozen=True)
class WanLayout:
    """What a checkpoint's configs say.

    pipeline: model_index `_class_name` (WanPipeline: text-to-video); boundary_ratio: Wan2.2 two-expert split
    (None: one transformer); expand_timesteps: per-token timesteps (Wan2.2 TI2V-5B); latent_channels: the
    transformer's input channels; scale_spatial / scale_temporal: VAE compression; patch: the transformer's
    (t, h, w) patch; text_dim: text encoder width.
    """

    pipeline: str
    boundary_ratio: float | None
    expand_timesteps: bool
    latent_channels: int
    scale_spatial: int
    scale_temporal: int
    patch: tuple[int, int, int]
    text_dim: int

    @property
    def size_multiple(self) -> int:
        """Width and height must be multiples of this (the VAE's spatial factor times the patch)."""
        return self.scale_spatial * max(self.patch[1], self.patch[2])

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """[channels, latent frames, latent height, latent width] of one video (WanPipeline.prepare_latents)."""
        return (self.latent_channels, (num_frames - 1) // self.scale_temporal + 1, height // self.scale_spatial,
                width // self.scale_spatial)


def _config(path: Path, name: str) -> dict:
    return read_config(path, name, "Wan")


def layout(path: str | Path) -> WanLayout:
    """Reads model_index.json, transformer/, vae/ and text_encoder/ configs. Raises FileNotFoundError."""
    path = Path(path)
    index = _config(path, "model_index.json")
    transformer = _config(path, "transformer/config.json") if (path / "transformer").is_dir() \
        else _config(path, "transformer_2/config.json")
    vae = _config(path, "vae/config.json")
    text = _config(path, "text_encoder/config.json")
    return WanLayout(pipeline=index.get("_class_name", TEXT_TO_VIDEO), boundary_ratio=index.get("boundary_ratio"),
                     expand_timesteps=bool(index.get("expand_timesteps", False)),
                     latent_channels=int(transformer["in_channels"]),
                     scale_spatial=int(vae.get("scale_factor_spatial", 8)),
                     scale_temporal=int(vae.get("scale_factor_temporal", 4)),
                     patch=tuple(int(p) for p in transformer["patch_size"]), text_dim=int(text["d_model"]))


def component(path: str | Path, name: str):
    """One component: "transformer", "transformer_2" (None if the checkpoint has one expert), "vae",
    "text_encoder", "tokenizer" or "scheduler" (the checkpoint's scheduler class). Raises FileNotFoundError."""
    if name == "transformer_2" and not (Path(path) / name).is_dir():
        return None
    return load_component(path, name, _CLASSES, "Wan")


def pipeline(path: str | Path, **components):
    """A diffusers `WanPipeline` holding `components` (missing ones are None), with the checkpoint's
    `boundary_ratio` / `expand_timesteps` and its VAE's scale factors even when the VAE is not loaded."""
    from diffusers import WanPipeline

    found = layout(path)
    names = ("tokenizer", "text_encoder", "vae", "scheduler", "transformer", "transformer_2")
    pipe = WanPipeline(**{n: components.get(n) for n in names}, boundary_ratio=found.boundary_ratio,
                       expand_timesteps=found.expand_timesteps)
    pipe.vae_scale_factor_spatial, pipe.vae_scale_factor_temporal = found.scale_spatial, found.scale_temporal
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_pipeline(path: str | Path):
    """The whole diffusers `WanPipeline` on the checkpoint (tests and the in-process benchmark baseline)."""
    names = ("tokenizer", "text_encoder", "vae", "scheduler", "transformer", "transformer_2")
    return pipeline(path, **{n: component(path, n) for n in names})
