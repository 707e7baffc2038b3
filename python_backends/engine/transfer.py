"""Small host <-> device copies of the engine threads that do not stall the thread's CUDA stream.

`torch.tensor(values, device="cuda")` and `.to("cuda")` of a pageable CPU tensor copy synchronously: PyTorch
waits for the stream, i.e. for every kernel queued on it before the copy (in a decode step that is the previous
step's whole graph), and the GPU then idles while the host builds the rest of the step. Likewise `.cpu()` /
`.tolist()` wait for everything queued before them, including work launched after the result was ready.
`to_device` stages through pinned memory and copies without waiting; `HostCopy` copies a device tensor into
pinned memory and waits for that copy alone (work queued after it keeps running).
"""
from __future__ import annotations

import torch


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` on `device` without synchronising the current stream.

    On CUDA the values go through a pinned host tensor and a non-blocking copy on the current stream (torch's caching
    host allocator does not hand the pinned block out again before that copy has run); elsewhere a plain tensor.
    values: a (nested) list of numbers or bools. Raises as `torch.tensor` on ragged or non-numeric values.
    """
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class HostCopy:
    """One device tensor copied to the host in the background: made right after the kernels that write the tensor
    are launched; `result()` waits for the copy only, so work launched after it (the next step) keeps the GPU busy
    while the host reads. On CPU the tensor itself.

    Args:
        tensor: the tensor to read (not modified; it may be overwritten after the copy was enqueued: stream order).
    """

    def __init__(self, tensor: torch.Tensor):
        if tensor.device.type != "cuda":
            self._host, self._done = tensor, None
            return
        self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor, non_blocking=True)
        self._done = torch.cuda.Event()
        self._done.record()

    def result(self) -> torch.Tensor:
        """The host tensor (waits for the copy on CUDA; returns at once when it already ran)."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        return self._host
