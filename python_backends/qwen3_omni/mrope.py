"""The talker's M-RoPE positions of a prompt with images, as transformers' `Qwen3OmniMoeTalkerForConditionalGeneration`
computes them in `generate` (`get_rope_index` over the talker's input ids and the image grids; transformers 5.24).

Text and audio placeholders take one position each, 0, 1, 2, ... in all three sections (temporal, height, width). An
image's placeholders (t * h * w / merge**2 of them, row-major over its merged grid) take 3-D positions: start +
(t_index * position_id_per_seconds, row, column), where start is the position after the tokens before it; the token
after an image continues from the image's largest position + 1. The positions after the prompt are those of text,
shifted by the prompt's rope delta (largest position + 1 - length, <= 0).
"""
from __future__ import annotations

import torch


def image_positions(ids: torch.Tensor, image_grid_thw: torch.Tensor, *, image_token_id: int, merge_size: int,
                    position_id_per_seconds: int) -> tuple[torch.Tensor, int]:
    """M-RoPE positions of a prompt.

    Args:
        ids: int64 [L] token ids (image placeholders expanded).
        image_grid_thw: int64 [K, 3] the (t, h, w) patch grid of each image placeholder run of `ids`, in order.
        image_token_id: the placeholder id (`<|image_pad|>`); merge_size: the vision tower's spatial merge;
        position_id_per_seconds: the temporal position step of one grid frame (config).

    Returns:
        (positions int64 [3, L] (temporal, height, width), rope delta: the next position minus L).

    Raises:
        ValueError: when the placeholder runs do not match the grids (count or t * h * w / merge**2 tokens).
    """
    image = (ids == image_token_id).long()
    edges = torch.diff(image, prepend=image.new_zeros(1), append=image.new_zeros(1))
    starts, ends = (edges == 1).nonzero().flatten().tolist(), (edges == -1).nonzero().flatten().tolist()
    if len(starts) != len(image_grid_thw):
        raise ValueError(f"{len(starts)} image placeholder runs but {len(image_grid_thw)} image grids")
    parts, done, nxt = [], 0, 0
    for start, end, (t, h, w) in zip(starts, ends, image_grid_thw.tolist()):
        rows, cols = h // merge_size, w // merge_size
        if end - start != t * rows * cols:
            raise ValueError(f"a run of {end - start} tokens for a grid of {t}x{rows}x{cols} (merged)")
        parts.append(torch.arange(nxt, nxt + start - done).expand(3, -1))
        nxt += start - done
        grid = torch.stack(torch.meshgrid(torch.arange(t) * position_id_per_seconds, torch.arange(rows),
                                          torch.arange(cols), indexing="ij")).flatten(1)
        parts.append(grid + nxt)
        nxt, done = int(parts[-1].max()) + 1, end
    parts.append(torch.arange(nxt, nxt + len(ids) - done).expand(3, -1))
    positions = torch.cat(parts, 1)
    return positions, int(positions.max()) + 1 - len(ids) if len(ids) else 0
