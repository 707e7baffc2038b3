"""Reading a Triton model's configuration inside `initialize(args)`."""
from __future__ import annotations

import json
import os
from pathlib import Path


def load(args: dict) -> tuple[str, dict, dict[str, str]]:
    """(model name, model config as a dict, config.pbtxt `parameters` as {key: string_value})."""
    config = json.loads(args["model_config"])
    parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    return args["model_name"], config, parameters


def int_parameter(parameters: dict, name: str, default: int) -> int:
    """An integer model-config parameter ("" or missing: default). Raises ValueError naming it."""
    raw = parameters.get(name) or ""
    try:
        return int(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"config parameter {name!r} must be an integer, got {raw!r}") from None


def float_parameter(parameters: dict, name: str, default: float | None) -> float | None:
    """A float model-config parameter ("" or missing: default). Raises ValueError naming it."""
    raw = (parameters.get(name) or "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ValueError(f"config parameter {name!r} must be a number, got {raw!r}") from None


def apply_nice(parameters: dict) -> int:
    """Lowers this stub process's CPU priority by the parameter `nice` (0-19; 0 or absent: unchanged) and
    returns the niceness added. Each model instance is its own process, so a stage that must not compete
    with another for the cores (e.g. the voice LLM, which writes text far faster than speech is spoken,
    against the TTS that makes the audio a listener waits for) gives way under load and still runs at full
    speed when the cores are free. Raises ValueError for a value outside 0-19."""
    nice = int_parameter(parameters, "nice", 0)
    if not 0 <= nice <= 19:
        raise ValueError(f"config parameter 'nice' must be within 0-19, got {nice}")
    if nice:
        os.nice(nice)
    return nice


def sequence_idle_seconds(config: dict, default_s: float = 120.0) -> float:
    """`sequence_batching.max_sequence_idle_microseconds` of a model config in seconds (Triton frees an
    idle sequence's slot after it; default_s when the config does not set it)."""
    raw = (config.get("sequence_batching") or {}).get("max_sequence_idle_microseconds")
    try:
        return int(raw) / 1e6 if raw else default_s
    except (TypeError, ValueError):
        return default_s


def stage_checkpoint(parameters: dict, model_name: str, default: str) -> Path:
    """For torch stages: sets torch's intra-op threads from the parameter `threads` (0 or absent: torch's
    default, one per core, which an in-process diffusers pipeline uses too: CPU convolutions give other bits
    with other thread counts) and returns the directory the parameter `checkpoint` names (or `default`;
    absolute, or relative to $OMNI_MODEL_HOME). Raises FileNotFoundError naming the model and the path,
    ValueError for a bad `threads`."""
    import torch

    from omni_backends.paths import resolve_checkpoint

    threads = int_parameter(parameters, "threads", 0)
    if threads > 0:
        torch.set_num_threads(threads)
    return resolve_checkpoint(parameters.get("checkpoint") or default, model_name)
