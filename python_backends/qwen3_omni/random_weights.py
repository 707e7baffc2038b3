"""`qwen3_omni_30b_a3b_random`: Qwen3-Omni-30B-A3B at its real sizes with random weights, built on the device.

For serving and benchmarking the full-size model where the real weights are not available (they are
65.7 GiB and no model hub is reachable). `write_random_checkpoint(dir)` writes a checkpoint directory
without weights: the real 30B-A3B `config.json` (`REAL_CONFIG`, the published checkpoint's sizes, NOT
transformers' config defaults), a tokenizer in the real id layout (`tiny_tokenizer`, layout
`qwen3_omni`), the 128-bin `WhisperFeatureExtractor` and the marker `random_weights.json`.
`loading` sees the marker and builds each stage directly on its device in its dtype (`build_random`),
which takes seconds instead of reading a checkpoint.

Random weights are deterministic: each parameter of the thinker and the talker is drawn from
N(0, 0.02) with a generator seeded by its name (`parameter_seed`), so separate processes on the same
kind of device build identical weights (the talker stage rebuilds the thinker's embedding rows it
needs, `random_rows`). Norm weights stay 1 and biases 0; routers and the talker's experts are random
too (transformers leaves the talker experts uninitialised and the routers at zero, which would send
every token to the same experts and make timings wrong). code2wav uses `checkpoint.fix_code2wav_init`
so the audio is not silent. Random weights never emit EOS: benchmarks fix the output lengths.
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import torch
from transformers import Qwen3OmniMoeConfig, WhisperFeatureExtractor

from .checkpoint import fix_code2wav_init
from .tiny_tokenizer import build_tokenizer

MARKER = "random_weights.json"
SEED = 20250922
STD = 0.02

ROPE_THINKER = {"rope_type": "default", "rope_theta": 1000000, "mrope_section": [24, 20, 20],
                "interleaved": True, "mrope_interleaved": True}
ROPE_TALKER = {"rope_type": "default", "rope_theta": 1000000, "mrope_section": [24, 20, 20], "interleaved": True}

# The published Qwen3-Omni-30B-A3B-Instruct config.json sizes (35,259,818,545 parameters).
REAL_CONFIG = dict(
    thinker_config=dict(
        text_config=dict(
            vocab_size=152064, hidden_size=2048, intermediate_size=768, num_hidden_layers=48,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128, moe_intermediate_size=768,
            num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], max_position_embeddings=65536, rms_norm_eps=1e-6,
            rope_parameters=ROPE_THINKER, tie_word_embeddings=False, hidden_act="silu"),
        audio_config=dict(
            d_model=1280, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120,
            num_mel_bins=128, output_dim=2048, downsample_hidden_size=480, n_window=50,
            n_window_infer=800, conv_chunksize=500, max_source_positions=1500),
        vision_config=dict(
            depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
            num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
            hidden_act="gelu_pytorch_tanh", in_channels=3),
        audio_token_id=151675, image_token_id=151655, video_token_id=151656,
        audio_start_token_id=151669, audio_end_token_id=151670, user_token_id=872,
        vision_start_token_id=151652, vision_end_token_id=151653, position_id_per_seconds=13,
        seconds_per_chunk=2, tie_word_embeddings=False),
    talker_config=dict(
        text_config=dict(
            vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
            num_attention_heads=16, num_key_value_heads=2, head_dim=128, moe_intermediate_size=384,
            shared_expert_intermediate_size=768, num_experts=128, num_experts_per_tok=6,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            max_position_embeddings=65536, rms_norm_eps=1e-6, rope_parameters=ROPE_TALKER,
            tie_word_embeddings=False, hidden_act="silu"),
        code_predictor_config=dict(
            vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16,
            max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000}),
        accept_hidden_layer=24, num_code_groups=16, thinker_hidden_size=2048,
        codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155, codec_pad_id=2148,
        codec_think_bos_id=2156, codec_think_eos_id=2157,
        speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303},
        audio_token_id=151675, image_token_id=151655, video_token_id=151656,
        vision_start_token_id=151652, audio_start_token_id=151669, audio_end_token_id=151670,
        position_id_per_seconds=13, seconds_per_chunk=2, spatial_merge_size=2,
        tie_word_embeddings=False),
    code2wav_config=dict(
        codebook_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=16, sliding_window=72,
        rope_parameters={"rope_type": "default", "rope_theta": 10000}, rms_norm_eps=1e-5,
        layer_scale_initial_scale=0.01, decoder_dim=1536, upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2], max_position_embeddings=8000, num_quantizers=16),
    enable_audio_output=True, im_start_token_id=151644, im_end_token_id=151645,
    tts_pad_token_id=151671, tts_bos_token_id=151672, tts_eos_token_id=151673,
    system_token_id=8948, user_token_id=872, assistant_token_id=77091,
)
REAL_CHECKPOINT_PARAMS = 35_259_818_545


def write_random_checkpoint(out_dir: str | os.PathLike, config: dict | None = None) -> Path:
    """Write the weightless checkpoint directory (idempotent: a directory with the marker is left as is).

    config: `Qwen3OmniMoeConfig` kwargs (default `REAL_CONFIG`); its special token ids must be the real ones
    (the tokenizer has the real layout). Returns the directory.
    """
    out = Path(out_dir)
    if (out / MARKER).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    omni = Qwen3OmniMoeConfig(**(config or REAL_CONFIG))
    omni.save_pretrained(out)
    build_tokenizer(layout="qwen3_omni").save_pretrained(out)
    mel_bins = omni.thinker_config.audio_config.num_mel_bins
    WhisperFeatureExtractor(feature_size=mel_bins, sampling_rate=16000, hop_length=160, chunk_length=30,
                            n_fft=400, return_attention_mask=True).save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"seed": SEED, "std": STD}) + "\n")
    return out


def is_random(path: str | os.PathLike) -> bool:
    """True for a checkpoint directory written by `write_random_checkpoint`."""
    return (Path(path) / MARKER).is_file()


def parameter_seed(name: str) -> int:
    """Seed of a parameter's generator, from its name in the full model (`thinker.` / `talker.` prefix;
    transformers 5.2x's `language_model.` level is dropped so every 5.x names it the same)."""
    return SEED ^ zlib.crc32(name.replace("language_model.", "").encode())


@torch.no_grad()
def randomize(module: torch.nn.Module, prefix: str) -> None:
    """Fill every parameter of 2 or more dimensions of `module` (linear, embedding, router, experts) from
    N(0, STD) with its own seeded generator; 1-D parameters (norm weights, biases) are left as built."""
    for name, param in module.named_parameters():
        if param.ndim >= 2:
            generator = torch.Generator(device=param.device).manual_seed(parameter_seed(f"{prefix}{name}"))
            param.normal_(0.0, STD, generator=generator)


def random_rows(name: str, shape: tuple[int, ...], rows: list[int], dtype: torch.dtype,
                device: torch.device | str) -> torch.Tensor:
    """Rows of the random parameter `name` (full-model name) of `shape`, as `randomize` draws it on `device`."""
    generator = torch.Generator(device=device).manual_seed(parameter_seed(name))
    full = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, STD, generator=generator)
    return full[rows].clone()


def build_random(cls, sub_config, prefix: str, device: torch.device | str, dtype: torch.dtype) -> torch.nn.Module:
    """A model of class `cls` for `sub_config`, built on `device` in `dtype` with random weights. `prefix`:
    "thinker.", "talker." or "code2wav." for one stage; "" for the whole `Qwen3OmniMoeForConditionalGeneration`
    (each stage drawn as its stage model draws it, so a baseline has the served stages' weights)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls._from_config(sub_config, dtype=dtype)
    finally:
        torch.set_default_dtype(previous)
    parts = {"thinker.": model.thinker, "talker.": model.talker, "code2wav.": model.code2wav} if prefix == "" \
        else {prefix: model}
    for name, part in parts.items():
        if name == "code2wav.":
            torch.manual_seed(SEED)
            fix_code2wav_init(part)
        else:
            randomize(part, name)
    return model.eval()
