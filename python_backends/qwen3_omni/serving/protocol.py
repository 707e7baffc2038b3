"""Tensors between the Qwen3-Omni Triton models and the settings they share (no Triton imports).

thinker (engine stage, decoupled, max_batch_size 0)
  in   REQUEST        BYTES [1]     pipeline REQUEST JSON (omni_frontend.chat_protocol), plus
                                    "talker_inputs": bool (default true: send EMBED / PROMPT_*)
       INPUT_AUDIO    FP32 [S]      optional, 16 kHz mono, sliced by the input_audio parts
       INPUT_IMAGES   UINT8 [K, H, W, 3]  optional, RGB, padded to the largest H, W; image k for the k-th
                                    {"type": "image"} part (chat_request.input_images)
       INPUT_IMAGE_SIZES  INT32 [K, 2]    with INPUT_IMAGES: each image's real (h, w)
  out  EVENT          BYTES [1]     per token {"type": "token", "token_id", "index", "text"};
                                    last {"type": "done", "token_id" (or null), "index", "text",
                                    "finish_reason", "usage": {"prompt_tokens", "completion_tokens"}}
       EMBED          FP32 [1, H]   layer-0 embedding of token_id (absent without a token)
       PROMPT_IDS     INT64 [P]     first response only: prompt ids (audio placeholders expanded)
       PROMPT_EMBEDS  FP32 [P, H]   first response only: layer-0 hidden states of the prompt
       MM_HIDDEN      FP32 [M, H]   first response only: accept-layer hidden states of the M
                                    audio/image/video placeholder positions (M may be 0)
       IMAGE_GRID_THW INT64 [K, 3]  first response only: each image's (t, h, w) patch grid (K may be 0;
                                    the talker's M-RoPE positions of image placeholders)
talker (sequence batching, correlation id = one chat turn; decoupled; max_batch_size 8: every
tensor below has a leading batch dim of 1)
  in   START / END    BOOL [1]      sequence controls; END = the thinker's text is complete
       TEXT_EMBEDS    FP32 [n, H]   EMBED of the thinker tokens new since the last request (n >= 0)
       PROMPT_IDS / PROMPT_EMBEDS / MM_HIDDEN / IMAGE_GRID_THW   with START only (as the thinker's)
       TALKER_PARAMS  BYTES [1]     with START only: JSON {"voice", "do_sample", "temperature",
                                    "top_k", "top_p", "repetition_penalty", "seed", "max_frames",
                                    "min_frames"}
       ABORT          BOOL [1]      optional: forget the sequence now (the turn was cancelled)
  out  CODES          INT64 [16, f] codec frames (12.5 Hz), streamed as they are made; a request
                                    ends (FINAL) when the talker needs more text or the turn ends
       FINISH_REASON  BYTES [1]     on the turn's last response only: "stop" | "length"
code2wav (sequence batching, non-decoupled, max_batch_size 8, batch dim 1)
  in   START / END    BOOL [1]      END = decode everything left and forget the sequence
       CODES          INT64 [16, f] new frames (f >= 0)
       ABORT          BOOL [1]      optional: forget the sequence without decoding
  out  PCM            FP32 [s]      float32 samples at 24 kHz that became final (s may be 0)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omni_backends.engine.options import EngineOptions, parse_bool
from omni_backends.serving import model_config

REQUEST, INPUT_AUDIO, EVENT = "REQUEST", "INPUT_AUDIO", "EVENT"
INPUT_IMAGES, INPUT_IMAGE_SIZES = "INPUT_IMAGES", "INPUT_IMAGE_SIZES"
MEDIA_INPUTS = (INPUT_AUDIO, INPUT_IMAGES, INPUT_IMAGE_SIZES)   # optional inputs passed on from the client's request
EMBED, PROMPT_IDS, PROMPT_EMBEDS, MM_HIDDEN = "EMBED", "PROMPT_IDS", "PROMPT_EMBEDS", "MM_HIDDEN"
IMAGE_GRID_THW = "IMAGE_GRID_THW"
TEXT_EMBEDS, TALKER_PARAMS, CODES, FINISH_REASON = "TEXT_EMBEDS", "TALKER_PARAMS", "CODES", "FINISH_REASON"
START, END, ABORT, PCM = "START", "END", "ABORT", "PCM"
PROMPT_TENSORS = (PROMPT_IDS, PROMPT_EMBEDS, MM_HIDDEN, IMAGE_GRID_THW)
THINKER_OUTPUTS = [EVENT, EMBED, *PROMPT_TENSORS]

TALKER_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_frames", "min_frames")


def flag(tensor: np.ndarray | None) -> bool:
    """A BOOL/INT control tensor (any shape, one element) as bool; False when absent."""
    return tensor is not None and bool(tensor.reshape(-1)[0])


def stage_checkpoint(parameters: dict, model_name: str):
    """Common stage setup from model-config parameters: sets torch's intra-op threads (`threads`, default 1)
    and returns the checkpoint directory (`checkpoint`, default the tiny one; absolute or relative to
    $OMNI_MODEL_HOME). Raises FileNotFoundError naming the model and the path."""
    import torch

    from omni_backends.paths import QWEN3_OMNI_TINY, resolve_checkpoint

    torch.set_num_threads(model_config.int_parameter(parameters, "threads", 1))
    return resolve_checkpoint(parameters.get("checkpoint") or QWEN3_OMNI_TINY, model_name)


def stage_parameters(parameters: dict[str, str], stage: str) -> dict[str, str]:
    """One stage's parameters of the co-located model, whose config holds every stage's settings as
    `<stage>.<key>` (e.g. `thinker.max_len`) beside shared unprefixed ones (checkpoint, kernels, threads):
    the shared keys overlaid with the stage's own, prefix removed."""
    shared = {k: v for k, v in parameters.items() if "." not in k}
    own = {k[len(stage) + 1:]: v for k, v in parameters.items() if k.startswith(f"{stage}.")}
    return {**shared, **own}


def code2wav_settings(parameters: dict[str, str], max_batch: int, prefix: str = "") -> dict:
    """`Code2WavStreamer` keyword arguments from a stage's parameters: `chunk_frames` (default 25),
    `first_chunk_frames` (5), `left_context_frames` (25), `cuda_graphs` (false) and `max_batch` (the largest graph
    batch bucket); `prefix` names the parameters in errors (the co-located model's "code2wav."). Raises ValueError
    naming a bad parameter."""
    return {"chunk_frames": model_config.int_parameter(parameters, "chunk_frames", 25),
            "first_chunk_frames": model_config.int_parameter(parameters, "first_chunk_frames", 5),
            "left_context_frames": model_config.int_parameter(parameters, "left_context_frames", 25),
            "graphs": parse_bool(parameters.get("cuda_graphs"), f"{prefix}cuda_graphs", False),
            "max_batch": max_batch}


DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass(frozen=True)
class StageSetup:
    """Where and how a stage runs (from its Triton args and config parameters; see `stage_setup`).

    path: checkpoint directory; device: "cpu" or "cuda:N" (the instance's GPU for KIND_GPU);
    dtype: torch dtype or None (auto: bfloat16 on CUDA, the checkpoint's on CPU); options: `EngineOptions`;
    gpu_tensors: hidden states between stages stay on the GPU (DLPack), only meaningful on CUDA.
    """

    path: Path
    device: str
    dtype: object
    options: EngineOptions
    gpu_tensors: bool


def stage_setup(args: dict, parameters: dict, model_name: str) -> StageSetup:
    """Parse the stage settings: `checkpoint`, `threads` (see `stage_checkpoint`), the device (KIND_GPU
    instance -> cuda:<model_instance_device_id>), `dtype` (auto | bfloat16 | float16 | float32),
    `engine` / `cuda_graphs` / `max_len` / `prefill_chunk` (`EngineOptions`), `kernels` (true: the
    omni_kernels Triton kernels on CUDA) and `gpu_tensors` (default true). Raises ValueError naming a
    bad parameter, FileNotFoundError for a missing checkpoint."""
    import torch

    from omni_backends.engine import fused

    path = stage_checkpoint(parameters, model_name)
    device = "cpu"
    if str(args.get("model_instance_kind", "")).upper() == "GPU":
        device = f"cuda:{int(args.get('model_instance_device_id') or 0)}"
        torch.cuda.set_device(device)
    dtype_name = (parameters.get("dtype") or "auto").strip()
    if dtype_name not in DTYPES:
        raise ValueError(f"config parameter 'dtype' must be one of {DTYPES}, got {dtype_name!r}")
    fused.set_enabled(parse_bool(parameters.get("kernels"), "kernels", True))
    return StageSetup(path=path, device=device, dtype=None if dtype_name == "auto" else getattr(torch, dtype_name),
                      options=EngineOptions.from_parameters(parameters),
                      gpu_tensors=device != "cpu" and parse_bool(parameters.get("gpu_tensors"), "gpu_tensors", True))
