"""Block sizes of the fused-MoE kernels, per token-count bucket (the table `scripts/bench_kernels --tune-moe`
measures candidates for; edit it with the winners it prints).

BLOCK_M is shared by both grouped GEMMs because it is the alignment of the expert-sorted token layout.
Decode (1-64 tokens, at most a few rows per expert): BLOCK_M 16 (the smallest MMA tile), narrow BLOCK_N so
that ~8 experts x (N / BLOCK_N) programs cover the 132 SMs, long BLOCK_K (contiguous weight rows, 16-byte
loads) and deep pipelining: these launches only stream expert weights. Prefill (up to 8k tokens):
wgmma-sized 64/128-row tiles, grouped launch order (GROUP_M) so the blocks of one expert reuse its weights
from L2. First guesses for the H200 (thinker H=2048, I=768; talker H=1024, I=384) until tuned there.
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
    BLOCK_M: int
    gate_up: GemmConfig
    down: GemmConfig


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
MOE_CONFIGS: dict[tuple[int, int], list[tuple[int, MoeConfig]]] = {
    THINKER: DEFAULT_CONFIGS,
    TALKER: DEFAULT_CONFIGS,
}


def moe_config(num_tokens: int, hidden: int | None = None, inter: int | None = None) -> MoeConfig:
    """The table's config for `num_tokens` tokens of experts with hidden size `hidden` and intermediate size
    `inter` (the shape's own table when it has one, else DEFAULT_CONFIGS)."""
    for bound, config in MOE_CONFIGS.get((hidden, inter), DEFAULT_CONFIGS):
        if num_tokens <= bound:
            return config
    raise AssertionError("the last bucket is unbounded")
