"""Where prepared checkpoints live: the model home `$OMNI_MODEL_HOME`
(default `~/.cache/omni-triton/models`). Model configs name checkpoints relative to it."""
from __future__ import annotations

import os
from pathlib import Path

MODEL_HOME_ENV = "OMNI_MODEL_HOME"
QWEN3_OMNI_TINY = "qwen3_omni_tiny"
# the completion marker's text of the current tiny recipe (`qwen3_omni.checkpoint`): bump when it changes
QWEN3_OMNI_TINY_VERSION = "tiny random Qwen3-Omni checkpoint v2: vision tower + image processor\n"
QWEN3_OMNI_30B_RANDOM = "qwen3_omni_30b_a3b_random"   # full-size config, random weights built at load
# Written last into a finished tiny checkpoint (qwen3_omni, qwen_image): `prepare` checks it before importing
# the libraries that build one (~10 s at every launch before).
TINY_COMPLETE_MARKER = ".omni_tiny_complete"


def model_home(override: str | os.PathLike | None = None) -> Path:
    """`override`, else `$OMNI_MODEL_HOME`, else `~/.cache/omni-triton/models` (not created here)."""
    chosen = override or os.environ.get(MODEL_HOME_ENV) or Path.home() / ".cache" / "omni-triton" / "models"
    return Path(chosen).expanduser()


def resolve_checkpoint(value: str, model_name: str) -> Path:
    """A checkpoint parameter of a model config -> an existing directory.

    Absolute paths are used as they are; relative ones are taken inside the model home.
    Raises FileNotFoundError naming the model and the path (Triton shows it as the load error).
    """
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = model_home() / path
    if not path.is_dir():
        raise FileNotFoundError(f"{model_name}: checkpoint directory {path} does not exist "
                                f"(prepare it with `python -m omni_backends.prepare`, or set the model's "
                                f"'checkpoint' parameter / ${MODEL_HOME_ENV})")
    return path
