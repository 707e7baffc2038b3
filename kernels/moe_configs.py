"""Block sizes of the fused-MoE kernels, per token-count bucket (the table `scripts/bench_kernels --tune-moe`
measures candidates for; edit it with the winners it prints).

At the fewest tokens the one-launch decode path (`moe_decode`, `DecodeConfig`) runs; past `decode_tokens` the
grouped path (`MoeConfig`) below.

BLOCK_M is shared by both grouped GEMMs because it is the alignment of the expert-sorted token layout.
Decode (1-64 tokens, at most a few rows per expert): BLOCK_M 16 (the smallest MMA tile), narrow BLOCK_N so
that ~8 experts x (N / BLOCK_N) programs cover the 132 SMs, long BLOCK_K (contiguous weight rows, 16-byte
loads) and deep pipelining: these launches only stream expert weights. Prefill (up to 8k tokens):
wgmma-sized 64/128-row tiles, grouped launch order (GROUP_M) so the blocks of one expert reuse its weights
from L2. The thinker's (H=2048, I=768) and the talker's (H=1024, I=384) decode buckets are tuned on the H200;
the other buckets are first guesses.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Tile of one grouped GEMM: BLOCK_N output columns (per gate/up half for gate_up), BLOCK_K reduction
    step, GROUP_M row blocks launched together, and Triton's num_warps / num_stages."""
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int = 1
    num_warps: int = 4
    num_stages: int = 4


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """The grouped path (`moe.fused_moe`: route + align, gate_up GEMM, down GEMM, top-k sum)."""
    BLOCK_M: int
    gate_up: GemmConfig
    down: GemmConfig


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The one-launch decode path (`moe_decode`): one program per token-slot and BLOCK_N (>= 16) columns of I;
    BLOCK_K hidden elements per gate/up step, BLOCK_H hidden rows per down step, num_stages async-copy stages."""
    BLOCK_N: int
    BLOCK_K: int
    BLOCK_H: int
    num_warps: int = 4
    num_stages: int = 3


# Per expert shape (hidden H, intermediate I): (largest token count of the bucket, config), the first bucket
# whose bound is >= T is used. Shapes without a table of their own use DEFAULT_CONFIGS.
DEFAULT_CONFIGS: list[tuple[int, MoeConfig]] = [
    (16, MoeConfig(16, GemmConfig(32, 128, 1, 4, 5), GemmConfig(64, 128, 1, 4, 4))),
    (64, MoeConfig(16, GemmConfig(32, 128, 1, 4, 5), GemmConfig(64, 128, 1, 4, 4))),
    (256, MoeConfig(32, GemmConfig(64, 64, 4, 4, 4), GemmConfig(64, 64, 4, 4, 4))),
    (1024, MoeConfig(64, GemmConfig(64, 64, 8, 4, 4), GemmConfig(128, 64, 8, 4, 4))),
    (1 << 62, MoeConfig(128, GemmConfig(64, 64, 8, 8, 4), GemmConfig(128, 64, 8, 8, 4))),
]
THINKER, TALKER = (2048, 768), (1024, 384)   # Qwen3-Omni-30B-A3B: thinker top-8, talker top-6 (128 experts)
# Decode buckets (1, 4, 16 tokens) tuned on an H200 (`scripts/bench_kernels --tune-moe --tokens 1,4,16`,
# 2026-12-01, bench/results/tune_h200_run3.json): narrow 32-column tiles, 128-wide K steps, 4 stages, and
# 2 warps for the down GEMM from 4 tokens on. The winners beat the first guesses by at most 8%: at these
# sizes the GEMMs already stream the experts' weights at 70-95% of the copy bandwidth.
_BN32 = GemmConfig(32, 128, 1, 4, 4)
_BN32_2W = GemmConfig(32, 128, 1, 2, 4)
MOE_CONFIGS: dict[tuple[int, int], list[tuple[int, MoeConfig]]] = {
    THINKER: [(1, MoeConfig(16, _BN32, GemmConfig(64, 128, 1, 4, 4))),
              (4, MoeConfig(16, _BN32, _BN32_2W)),
              (16, MoeConfig(16, _BN32, _BN32_2W)),
              *DEFAULT_CONFIGS[1:]],
    TALKER: [(1, MoeConfig(16, _BN32, _BN32)),
             (4, MoeConfig(16, _BN32, _BN32_2W)),
             (16, MoeConfig(16, GemmConfig(64, 128, 1, 4, 4), _BN32_2W)),
             *DEFAULT_CONFIGS[1:]],
}


# The one-launch decode path, per expert shape: (largest token count, config); past the last bound the grouped
# path above runs. Tuned on the H200 (`scripts/bench_kernels --tune-decode --tokens 1`, run 14 with programmatic
# dependent launch, bench/results/tune_decode_h200_run14.json; runs 8-9 before it): thinker 32-column tiles,
# 128-wide K steps, 256-row down tiles, 4 stages (25.3 us; the run-9 tile 64 x 256 x 512 took 28.1 us there: its
# 196 KB of shared memory leave no room for the next launch's programs to start early), talker 32 x 256 x 512.
# It won at 2 and 4 tokens too in runs 8-9, but its results there were wrong then (one row right, the others
# not; see the finish in `splitk`): the tables stop at one token until a run checks more.
DEFAULT_DECODE_CONFIGS: list[tuple[int, DecodeConfig]] = [(1, DecodeConfig(32, 256, 512, 4, 3))]
DECODE_CONFIGS: dict[tuple[int, int], list[tuple[int, DecodeConfig]]] = {
    THINKER: [
        (1, DecodeConfig(BLOCK_N=32, BLOCK_K=128, BLOCK_H=256, num_warps=4, num_stages=4)),
    ],
    TALKER: [
        (1, DecodeConfig(BLOCK_N=32, BLOCK_K=256, BLOCK_H=512, num_warps=4, num_stages=3)),
    ],
}

def decode_tokens(hidden: int | None, inter: int | None) -> int:
    """Up to how many tokens the one-launch decode path runs for experts of this shape (0: never)."""
    table = DECODE_CONFIGS.get((hidden, inter), DEFAULT_DECODE_CONFIGS)
    return table[-1][0] if table else 0


def moe_config(num_tokens: int, hidden: int | None = None, inter: int | None = None,
               one_launch: bool = True) -> MoeConfig | DecodeConfig:
    """The table's config for `num_tokens` tokens of experts with hidden size `hidden` and intermediate size
    `inter` (the shape's own tables when it has them, else the defaults): a DecodeConfig up to
    `decode_tokens(hidden, inter)` tokens unless `one_launch` is False, else the grouped path's MoeConfig."""
    decode = DECODE_CONFIGS.get((hidden, inter), DEFAULT_DECODE_CONFIGS) if one_launch else []
    for bound, config in [*decode, *MOE_CONFIGS.get((hidden, inter), DEFAULT_CONFIGS)]:
        if num_tokens <= bound:
            return config
    raise AssertionError("the last bucket is unbounded")
