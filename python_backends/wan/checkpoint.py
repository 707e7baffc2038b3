"""Deterministic tiny random-weight Wan2.2 text-to-video checkpoint in the diffusers layout of a real one.

`python -m omni_backends.wan.checkpoint OUT_DIR` writes what `WanPipeline.save_pretrained` writes for
Wan2.2-T2V-A14B-Diffusers: model_index.json (`WanPipeline`, `boundary_ratio` 0.875: the high-noise expert
`transformer` runs the early steps, the low-noise expert `transformer_2` the rest), `tokenizer/` (a T5-style
Unigram tokenizer trained here on a fixed corpus), `text_encoder/` (`UMT5EncoderModel`), `transformer/` and
`transformer_2/` (`WanTransformer3DModel`), `vae/` (`AutoencoderKLWan`, the Wan2.1 VAE layout: 16 latent
channels, 8x spatial and 4x temporal compression) and `scheduler/` (`UniPCMultistepScheduler` with flow
sigmas, as Wan2.2 ships). About 0.6 MB. The transformer's widths (inner 2 x 16, FFN 32, text 32) are
multiples of 32 on purpose: CPU element-wise kernels (SiLU, tanh-GELU) take a scalar path for a tensor's
last < 32 elements, so with narrower rows a row's bits would depend on how many rows share the call and
step batching could not stay bit-equal to the pipeline (real checkpoints are thousands wide). Idempotent:
a directory whose completion marker names this recipe's VERSION is left as it is.
"""
from __future__ import annotations

import os
from pathlib import Path

from omni_backends.diffusion.checkpoint import tiny_cli, write_tiny

SEED = 20250728
VERSION = "tiny random Wan2.2 T2V checkpoint v1 (omni_backends.wan.checkpoint)\n"  # bump when the recipe changes
TEXT_DIM = 32
BOUNDARY_RATIO = 0.875
_CORPUS = (
    "a cat walking on the grass", "a red car driving at night", "waves crashing on a beach at sunset",
    "a dog running through a snowy forest", "city lights reflected in the rain", "a bird flying over mountains",
    "a slow camera pan across a quiet lake", "blurry, low quality, distorted, static, watermark",
)


def build_tokenizer():
    """T5-style tokenizer (NFKC, Metaspace, Unigram of 160 pieces, `</s>` appended) as `T5TokenizerFast`;
    ids 0/1/2 are `<pad>`/`</s>`/`<unk>` as in UMT5. Piece scores are rounded to 6 decimals: the trainer's
    parallel sums differ in the last bits from run to run."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing
    from transformers import T5TokenizerFast

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(list(_CORPUS) * 20, trainers.UnigramTrainer(
        vocab_size=160, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    tok.post_processor = TemplateProcessing(single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    spec = json.loads(tok.to_str())
    spec["model"]["vocab"] = [[piece, round(score, 6)] for piece, score in spec["model"]["vocab"]]
    tok = Tokenizer.from_str(json.dumps(spec))
    return T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>", extra_ids=0)


def _transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=16,
                                 out_channels=16, text_dim=TEXT_DIM, freq_dim=256, ffn_dim=32, num_layers=2,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64)


def build_pipeline():
    """The tiny `WanPipeline` (random weights drawn under SEED)."""
    import torch  # imported here: a launch that finds the checkpoint written imports no torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = build_tokenizer()
    torch.manual_seed(SEED)
    text_encoder = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tokenizer), d_model=TEXT_DIM, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1)).eval()
    vae = AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                        num_train_timesteps=1000)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=_transformer(), transformer_2=_transformer(), boundary_ratio=BOUNDARY_RATIO)


def write_checkpoint(out_dir: str | os.PathLike) -> Path:
    """Writes the checkpoint into `out_dir` (omni_backends.diffusion.checkpoint.write_tiny); returns the path."""
    return write_tiny(out_dir, VERSION, lambda folder: build_pipeline().save_pretrained(folder))


if __name__ == "__main__":
    tiny_cli(__doc__, write_checkpoint)
