"""Tensor helpers shared by diffusion stages: ragged lists of arrays (images or latents of different
sizes) travel between Triton models as one zero-padded array plus the true sizes."""
from __future__ import annotations

import numpy as np


def pack_ragged(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """K arrays of equal rank whose last-but-one two dims (height, width) differ -> (padded [K, ..., Hmax,
    Wmax, ...], sizes INT32 [K, 2]). The spatial dims are `spatial_axes(array)`: for images [H, W, C] the
    first two, for latents [C, F, h, w] the last two."""
    axes = spatial_axes(arrays[0])
    sizes = np.array([[a.shape[axes[0]], a.shape[axes[1]]] for a in arrays], dtype=np.int32)
    shape = list(arrays[0].shape)
    shape[axes[0]], shape[axes[1]] = int(sizes[:, 0].max()), int(sizes[:, 1].max())
    padded = np.zeros((len(arrays), *shape), dtype=arrays[0].dtype)
    for k, a in enumerate(arrays):
        index = [slice(None)] * a.ndim
        index[axes[0]], index[axes[1]] = slice(0, a.shape[axes[0]]), slice(0, a.shape[axes[1]])
        padded[(k, *index)] = a
    return padded, sizes


def unpack_ragged(padded: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Inverse of `pack_ragged`. Raises ValueError if sizes do not fit the padded array."""
    if sizes.ndim != 2 or sizes.shape != (padded.shape[0], 2):
        raise ValueError(f"sizes must be INT32 [{padded.shape[0]}, 2], got {list(sizes.shape)}")
    axes = spatial_axes(padded[0])
    out = []
    for k, (height, width) in enumerate(sizes.tolist()):
        if not (0 < height <= padded.shape[1 + axes[0]] and 0 < width <= padded.shape[1 + axes[1]]):
            raise ValueError(f"size {height}x{width} does not fit the padded array {list(padded.shape)}")
        index = [slice(None)] * (padded.ndim - 1)
        index[axes[0]], index[axes[1]] = slice(0, height), slice(0, width)
        out.append(np.ascontiguousarray(padded[(k, *index)]))
    return out


def spatial_axes(array: np.ndarray) -> tuple[int, int]:
    """(height axis, width axis): images are [H, W, 3] (uint8), latents [..., h, w] (float)."""
    return (0, 1) if array.dtype == np.uint8 else (array.ndim - 2, array.ndim - 1)
