"""Triton tensors <-> numpy / torch, keeping GPU tensors on the GPU (DLPack, CUDA IPC between stubs).

A stage that produces a CUDA torch tensor hands it to Triton through DLPack (no host copy); Triton
passes it to the next stub through CUDA IPC, and that stub sees a GPU `pb_utils.Tensor`, which
`from_triton` wraps as a CUDA torch tensor (again without a copy). For the receiving model to get GPU
inputs at all its config needs `parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }`
(the deploy renderer sets it on GPU stages); BLS outputs stay where the producing model put them.
CPU data stays numpy, as everywhere else in the repository.

`StageMetrics.tensor` counts each tensor by memory (gpu | cpu): the proof that the thinker -> talker
hidden states never take a host round trip is `omni_stage_tensors_total{memory="gpu"}` on the
`EMBED` / `TEXT_EMBEDS` tensors and no `memory="cpu"` ones.
"""
from __future__ import annotations

import numpy as np
import triton_python_backend_utils as pb_utils


def to_triton(name: str, value):
    """A `pb_utils.Tensor` from a numpy array (copied into shared memory) or a torch tensor (CUDA: DLPack,
    no copy; CPU: as numpy)."""
    if isinstance(value, np.ndarray):
        return pb_utils.Tensor(name, value)
    if value.is_cuda:
        from torch.utils.dlpack import to_dlpack

        return pb_utils.Tensor.from_dlpack(name, to_dlpack(value.contiguous()))
    return pb_utils.Tensor(name, value.numpy())


def from_triton(tensor):
    """numpy array for a CPU tensor, CUDA torch tensor (zero-copy, DLPack) for a GPU one."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack())


def on_gpu(value) -> bool:
    """True for a CUDA torch tensor (what `from_triton` returns for GPU memory)."""
    return not isinstance(value, np.ndarray) and bool(getattr(value, "is_cuda", False))
