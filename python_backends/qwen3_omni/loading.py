"""Load Qwen3-Omni stages, each on its own, from ONE full checkpoint directory (tiny or real).

Two library workarounds (models.md, Qwen3-Omni): the standalone talker has no checkpoint conversion
mapping for its per-expert MoE weights (without it the experts silently stay random), and the talker /
code2wav classes do not strip their `talker.` / `code2wav.` key prefixes by themselves.
"""
from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import (AutoImageProcessor, AutoTokenizer, Qwen3OmniMoeCode2Wav, Qwen3OmniMoeConfig,
                          Qwen3OmniMoeTalkerForConditionalGeneration, Qwen3OmniMoeThinkerForConditionalGeneration,
                          WhisperFeatureExtractor)
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.utils import logging as hf_logging

from .random_weights import build_random, is_random, random_rows

register_checkpoint_conversion_mapping("Qwen3OmniMoeTalkerModel", get_checkpoint_conversion_mapping("qwen2_moe"),
                                       overwrite=True)

THINKER_EMBED_KEY = "thinker.model.embed_tokens.weight"
log = logging.getLogger(__name__)


@dataclass
class Qwen3OmniStages:
    """Everything of one checkpoint: config, the three stage models (eval mode), tokenizer, feature extractor and
    image processor (None when the checkpoint has none)."""

    config: Qwen3OmniMoeConfig
    thinker: Qwen3OmniMoeThinkerForConditionalGeneration
    talker: Qwen3OmniMoeTalkerForConditionalGeneration
    code2wav: Qwen3OmniMoeCode2Wav
    tokenizer: object
    feature_extractor: WhisperFeatureExtractor
    image_processor: object = None


def checkpoint_dir(path: str | os.PathLike) -> Path:
    """`path` as a Path; raises FileNotFoundError naming it when it holds no config.json."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no Qwen3-Omni checkpoint at {path} (config.json missing)")
    return path


def load_config(path: str | os.PathLike) -> Qwen3OmniMoeConfig:
    """The checkpoint's `Qwen3OmniMoeConfig`. Raises FileNotFoundError naming a missing directory."""
    return Qwen3OmniMoeConfig.from_pretrained(checkpoint_dir(path))


@contextmanager
def _quiet_load_reports():
    """Loading one stage from the full checkpoint reports every other stage's key as UNEXPECTED: silence it
    (and the progress bar) for the duration of the load."""
    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _load(cls, path, sub_config, prefix: str | None, device, dtype):
    if is_random(checkpoint_dir(path)):   # qwen3_omni_30b_a3b_random: built on the device, no weights to read
        model = build_random(cls, sub_config, f"{prefix or 'thinker'}.", device, dtype or default_dtype(device))
    else:
        kwargs = {"key_mapping": {rf"^{prefix}\.": ""}} if prefix else {}
        with _quiet_load_reports():
            model = cls.from_pretrained(checkpoint_dir(path), config=sub_config, dtype=dtype, **kwargs)
        model = model.to(device).eval()
    return use_capturable_experts(model)


def use_capturable_experts(model: torch.nn.Module) -> torch.nn.Module:
    """On CUDA, switch transformers' MoE experts to its `grouped_mm` implementation (sorted tokens + one
    grouped GEMM, no host synchronisation, so decode steps can be captured as CUDA graphs; the default
    loops over `nonzero()` experts). On CPU the default stays (it is the reference arithmetic)."""
    if next(model.parameters()).device.type == "cuda" and hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("grouped_mm")
        except (ValueError, ImportError) as exc:   # an older library: steps with experts stay eager
            log.warning("grouped_mm experts unavailable (%s); MoE decode steps will not be captured", exc)
    return model


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on CUDA, float32 elsewhere (the dtype a stage gets when its config names none)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def load_image_processor(path: str | os.PathLike):
    """The checkpoint's image processor (`Qwen2VLImageProcessor`, from the `image_processor_type` of its
    preprocessor_config.json, which real checkpoints share with the feature extractor), or None when it names
    none (e.g. the random 30B layout): such a thinker refuses images."""
    config = checkpoint_dir(path) / "preprocessor_config.json"
    if not config.is_file() or "image_processor_type" not in json.loads(config.read_text()):
        return None
    return AutoImageProcessor.from_pretrained(checkpoint_dir(path))


def load_thinker(path, config: Qwen3OmniMoeConfig | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None) -> Qwen3OmniMoeThinkerForConditionalGeneration:
    """Thinker (text model + audio/vision encoders) alone; dtype None keeps the checkpoint's dtype."""
    config = config or load_config(path)
    return _load(Qwen3OmniMoeThinkerForConditionalGeneration, path, config.thinker_config, None, device, dtype)


def load_talker(path, config: Qwen3OmniMoeConfig | None = None, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None) -> Qwen3OmniMoeTalkerForConditionalGeneration:
    """Talker (with its code predictor) alone, MoE experts converted from the per-expert layout."""
    config = config or load_config(path)
    return _load(Qwen3OmniMoeTalkerForConditionalGeneration, path, config.talker_config, "talker", device, dtype)


def load_code2wav(path, config: Qwen3OmniMoeConfig | None = None, device: str | torch.device = "cpu",
                  dtype: torch.dtype | None = None) -> Qwen3OmniMoeCode2Wav:
    """code2wav vocoder alone."""
    config = config or load_config(path)
    return _load(Qwen3OmniMoeCode2Wav, path, config.code2wav_config, "code2wav", device, dtype)


def read_checkpoint_rows(path: str | os.PathLike, key: str, rows: list[int]) -> torch.Tensor:
    """Rows of one checkpoint tensor without loading the rest (single or sharded safetensors).

    Returns [len(rows), ...] in the stored dtype. Raises KeyError when no shard holds `key`.
    """
    path = checkpoint_dir(path)
    index = path / "model.safetensors.index.json"
    shard = json.loads(index.read_text())["weight_map"].get(key) if index.is_file() else "model.safetensors"
    if shard is None:
        raise KeyError(f"{key} not in {index}")
    with safe_open(path / shard, framework="pt") as f:
        if key not in f.keys():
            raise KeyError(f"{key} not in {path / shard}")
        tensor = f.get_slice(key)
        return torch.stack([tensor[row] for row in rows])


def load_tts_embeds(path, config: Qwen3OmniMoeConfig | None = None, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """Thinker layer-0 embeddings of [tts_bos, tts_eos, tts_pad]: float [3, H_thinker]. The talker needs
    them (projected) and reads them here instead of loading the whole thinker (a random checkpoint:
    draws the rows the thinker process draws, on the same kind of device)."""
    config = config or load_config(path)
    ids = [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]
    if is_random(checkpoint_dir(path)):
        text = config.thinker_config.text_config
        return random_rows(THINKER_EMBED_KEY, (text.vocab_size, text.hidden_size), ids,
                           dtype or default_dtype(device), device)
    return read_checkpoint_rows(path, THINKER_EMBED_KEY, ids)


def load_stages(path: str | os.PathLike, device: str | torch.device = "cpu",
                dtype: torch.dtype | None = None) -> Qwen3OmniStages:
    """All stages of a tiny or real Qwen3-Omni directory. Raises FileNotFoundError naming a missing path."""
    config = load_config(path)
    return Qwen3OmniStages(
        config=config,
        thinker=load_thinker(path, config, device, dtype),
        talker=load_talker(path, config, device, dtype),
        code2wav=load_code2wav(path, config, device, dtype),
        tokenizer=AutoTokenizer.from_pretrained(checkpoint_dir(path)),
        feature_extractor=WhisperFeatureExtractor.from_pretrained(checkpoint_dir(path)),
        image_processor=load_image_processor(path),
    )
