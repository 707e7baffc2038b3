"""Deterministic tiny random-weight Qwen3-Omni checkpoint in the layout of a real one.

`python -m omni_backends.qwen3_omni.checkpoint OUT_DIR` writes config.json (`Qwen3OmniMoeConfig`),
model.safetensors, generation_config.json, the tokenizer files (tiny BPE + ChatML template, see
`tiny_tokenizer`) and preprocessor_config.json (`WhisperFeatureExtractor` and `Qwen2VLImageProcessor` settings in
one file, as in the real checkpoint). It is idempotent: a directory whose completion marker names
`paths.QWEN3_OMNI_TINY_VERSION` is left as it is; an older one is rebuilt.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2VLImageProcessorPil, Qwen3OmniMoeConfig, \
    Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

from omni_backends.diffusion.checkpoint import write_tiny
from omni_backends.paths import QWEN3_OMNI_TINY_VERSION, TINY_COMPLETE_MARKER

from .tiny_tokenizer import build_tokenizer

SEED = 20240917
COMPLETE_MARKER = TINY_COMPLETE_MARKER
CODEBOOK = 64          # codec codebook size (real: 2048)
CODE_GROUPS = 16       # codes per 12.5 Hz frame (real: 16)
THINKER_HIDDEN = 64
MEL_BINS = 32
VOICES = ("chelsie", "ethan", "aiden")   # same speaker names as the real checkpoint
PATCH, MERGE = 16, 2   # vision patch size and spatial merge (real: 16, 2): one image token per 32x32 pixels
IMAGE_PIXELS = (32 * 32, 128 * 128)   # the image processor's resize bounds (real: 56*56 .. 28*28*1280): <= 16 tokens


def _rope() -> dict:
    return {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "interleaved": True}


def tiny_config(tok) -> Qwen3OmniMoeConfig:
    """The tiny `Qwen3OmniMoeConfig` (models.md, Qwen3-Omni) with every special id taken from `tok`.

    Talker codec specials sit in the top 1024 ids of the talker vocab, where `generate` expects them.
    """
    ids = lambda t: tok.convert_tokens_to_ids(t)
    mm = dict(audio_token_id=ids("<|audio_pad|>"), image_token_id=ids("<|image_pad|>"),
              video_token_id=ids("<|video_pad|>"), audio_start_token_id=ids("<|audio_start|>"),
              vision_start_token_id=ids("<|vision_start|>"))
    cb = CODEBOOK
    return Qwen3OmniMoeConfig(
        thinker_config=dict(
            text_config=dict(vocab_size=len(tok), hidden_size=THINKER_HIDDEN, intermediate_size=128, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=32, num_experts=4,
                             num_experts_per_tok=2, max_position_embeddings=2048, rope_parameters=_rope()),
            audio_config=dict(d_model=32, encoder_attention_heads=4, encoder_ffn_dim=64, encoder_layers=1,
                              num_mel_bins=MEL_BINS, output_dim=THINKER_HIDDEN, downsample_hidden_size=32,
                              n_window=50, n_window_infer=100),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=PATCH,
                               spatial_merge_size=MERGE, out_hidden_size=THINKER_HIDDEN, deepstack_visual_indexes=[0],
                               num_position_embeddings=64),
            user_token_id=ids("user"), **mm),
        talker_config=dict(
            text_config=dict(vocab_size=cb + 1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=32, num_experts=4,
                             num_experts_per_tok=2, max_position_embeddings=4096, rope_parameters=_rope(),
                             shared_expert_intermediate_size=64),
            code_predictor_config=dict(vocab_size=cb, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       num_code_groups=CODE_GROUPS),
            num_code_groups=CODE_GROUPS, thinker_hidden_size=THINKER_HIDDEN, accept_hidden_layer=2,
            spatial_merge_size=2, codec_pad_id=cb, codec_bos_id=cb + 1, codec_eos_token_id=cb + 2,
            codec_nothink_id=cb + 3, codec_think_bos_id=cb + 4, codec_think_eos_id=cb + 5,
            speaker_id={name: cb + 6 + i for i, name in enumerate(VOICES)}, **mm),
        code2wav_config=dict(codebook_size=cb, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                             intermediate_size=64, num_hidden_layers=1, num_quantizers=CODE_GROUPS, decoder_dim=64,
                             upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], sliding_window=72),
        im_start_token_id=ids("<|im_start|>"), im_end_token_id=ids("<|im_end|>"), tts_pad_token_id=ids("<tts_pad>"),
        tts_bos_token_id=ids("<tts_text_bos>"), tts_eos_token_id=ids("<tts_text_eod>"),
        system_token_id=ids("system"), user_token_id=ids("user"), assistant_token_id=ids("assistant"))


def _fix_random_init(model: Qwen3OmniMoeForConditionalGeneration) -> None:
    """Repair what the library's random init gets wrong for a usable tiny model (call under a fixed seed).

    - Talker MoE experts are left as `torch.empty` (uninitialised memory, not reproducible): draw them
      from N(0, initializer_range) like the thinker's experts.
    - code2wav: see `fix_code2wav_init`.
    """
    std = model.config.talker_config.initializer_range
    with torch.no_grad():
        for module in model.talker.modules():
            if type(module).__name__ == "Qwen3OmniMoeTalkerTextExperts":
                for param in module.parameters():
                    param.normal_(0.0, std)
    fix_code2wav_init(model.code2wav)


@torch.no_grad()
def fix_code2wav_init(code2wav: torch.nn.Module) -> None:
    """code2wav's library init (conv weights at N(0, 0.02), ConvNeXt `gamma` 1e-6, layer scales 0.01) shrinks
    the signal to ~1e-7 (silence): use PyTorch's default conv init and unit scales instead (waveform std
    ~0.05). Draws from the global RNG."""
    for module in code2wav.modules():
        if isinstance(module, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)):
            module.reset_parameters()
    for name, param in code2wav.named_parameters():
        if name.endswith(".gamma") or "layer_scale" in name:
            param.fill_(1.0)


def build_model(tok) -> Qwen3OmniMoeForConditionalGeneration:
    """Random-weight `Qwen3OmniMoeForConditionalGeneration` for `tiny_config(tok)`, seeded with `SEED`
    (the global torch RNG state is restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3OmniMoeForConditionalGeneration(tiny_config(tok)).eval()
        _fix_random_init(model)
    model.generation_config = GenerationConfig(eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>")],
                                               pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    return model


def image_processor() -> Qwen2VLImageProcessorPil:
    """The tiny checkpoint's image processor: the real one's recipe (resize to multiples of PATCH * MERGE, CLIP
    normalisation, 2-frame temporal patches) with `IMAGE_PIXELS` resize bounds."""
    return Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2,
                                    size={"shortest_edge": IMAGE_PIXELS[0], "longest_edge": IMAGE_PIXELS[1]})


def _save(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    build_model(tok).save_pretrained(out)
    tok.save_pretrained(out)
    audio = WhisperFeatureExtractor(feature_size=MEL_BINS, sampling_rate=16000, hop_length=160, chunk_length=30,
                                    n_fft=400, return_attention_mask=True)
    merged = {**json.loads(audio.to_json_string()), **json.loads(image_processor().to_json_string())}
    (out / "preprocessor_config.json").write_text(json.dumps(merged, indent=2) + "\n")


def write_checkpoint(out_dir: str | os.PathLike) -> Path:
    """Write the tiny checkpoint into `out_dir` unless it holds this version already (`diffusion.checkpoint.
    write_tiny`: through a temporary sibling, the completion marker last). Returns the directory path."""
    return write_tiny(out_dir, QWEN3_OMNI_TINY_VERSION, _save)


def main(argv: list[str] | None = None) -> None:
    """CLI: write the tiny checkpoint into OUT_DIR (skipped when complete) and print its path."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="directory to write the checkpoint into")
    print(write_checkpoint(parser.parse_args(argv).out_dir))


if __name__ == "__main__":
    main()
