"""Loads Stable Audio components from one diffusers checkpoint directory (the tiny default, or a real
stable-audio-open-1.0 folder) and builds diffusers `StableAudioPipeline` objects around them, so that the
stages call the library's own `encode_prompt`, `encode_duration` and `prepare_latents`.

Each stage loads only its components (`component(path, "transformer")`, ...); `layout(path)` reads what the
others need to know from the JSON configs alone (no weights).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from omni_backends.diffusion.checkpoint import load_component, read_config

_CLASSES = {"transformer": "diffusers.StableAudioDiTModel", "vae": "diffusers.AutoencoderOobleck",
            "projection_model": "diffusers.StableAudioProjectionModel", "text_encoder": "transformers.T5EncoderModel"}
NAMES = ("vae", "text_encoder", "projection_model", "tokenizer", "transformer", "scheduler")


@dataclasses.dataclass(frozen=True)
class StableAudioLayout:
    """What a checkpoint's configs say.

    sample_rate: the VAE's output rate in Hz; channels: audio channels (2 for Stable Audio Open); hop: waveform
    samples per latent frame (the product of the VAE's downsampling ratios); sample_size: latent frames the DiT
    denoises (every request: the clip is cut from the decoded waveform); min_seconds / max_seconds: the range of
    the seconds_start / seconds_total conditioners.
    """

    sample_rate: int
    channels: int
    hop: int
    sample_size: int
    min_seconds: float
    max_seconds: float

    @property
    def max_duration(self) -> float:
        """The longest clip in seconds (`StableAudioPipeline.__call__`'s max_audio_length_in_s)."""
        return self.sample_size * self.hop / self.sample_rate

    def samples(self, start: float, end: float) -> int:
        """Waveform samples of the clip [start, end) s, as the pipeline cuts it."""
        return int(end * self.sample_rate) - int(start * self.sample_rate)


def _config(path: Path, name: str) -> dict:
    return read_config(path, name, "Stable Audio")


def layout(path: str | Path) -> StableAudioLayout:
    """Reads the vae/, transformer/ and projection_model/ configs. Raises FileNotFoundError."""
    path = Path(path)
    vae = _config(path, "vae/config.json")
    projection = _config(path, "projection_model/config.json")
    hop = 1
    for ratio in vae.get("downsampling_ratios", [2, 4, 4, 8, 8]):
        hop *= int(ratio)
    return StableAudioLayout(sample_rate=int(vae.get("sampling_rate", 44100)), channels=int(vae.get("audio_channels", 2)),
                             hop=hop, sample_size=int(_config(path, "transformer/config.json")["sample_size"]),
                             min_seconds=float(projection["min_value"]), max_seconds=float(projection["max_value"]))


def component(path: str | Path, name: str):
    """One of NAMES ("scheduler": the checkpoint's scheduler class). Raises FileNotFoundError."""
    return load_component(path, name, _CLASSES, "Stable Audio")


def pipeline(**components):
    """A diffusers `StableAudioPipeline` holding `components` (missing ones are None: its own __init__ reads
    the transformer's config, so a stage without one gets the pipeline's methods through a bare subclass)."""
    from diffusers import DiffusionPipeline, StableAudioPipeline

    class _Parts(StableAudioPipeline):
        def __init__(self, **parts):
            DiffusionPipeline.__init__(self)
            self.register_modules(**parts)

    pipe = _Parts(**{n: components.get(n) for n in NAMES})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_pipeline(path: str | Path):
    """The whole diffusers `StableAudioPipeline` on the checkpoint (tests and the in-process baseline)."""
    from diffusers import StableAudioPipeline

    pipe = StableAudioPipeline(**{n: component(path, n) for n in NAMES})
    pipe.set_progress_bar_config(disable=True)
    return pipe
