"""Bit-exact batching of a diffusers transformer across requests ("segments").

CPU GEMM libraries pick kernels by matrix shape, so a row's result depends on how many rows share the
call (MKL: M < 16 and M >= 16 give different bits). A batched forward therefore differs from the
library's unbatched pipeline in the last bits, and those differences grow through the denoising loop.
`SegmentedForward` keeps everything else batched (module traversal, norms, element-wise ops) but runs
every `nn.Linear`, every convolution (e.g. Wan's Conv3d patch embedding) and every attention call once
per segment, at exactly the shape the pipeline itself uses for that request: a segment is the rows of one pipeline call (one request's n images, cond or
uncond), and its text (encoder) stream is cut back to its own length (the batch pads it to the longest).

Usage (the family's denoiser decides which modules carry the text stream and how to cut attention args):

    seg = SegmentedForward(transformer, is_text_linear, trim_attention)
    with seg.layout([n_1, n_2, ...], [text_len_1, text_len_2, ...]):
        out = transformer(...)     # batched inputs, rows grouped by segment, text padded to max length
"""
from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Layout:
    """rows: batch rows of each segment (consecutive along dim 0); text: text length of each segment."""

    rows: tuple[int, ...]
    text: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.rows)

    def spans(self):
        """(start row, stop row, text length) of each segment."""
        start = 0
        for rows, text in zip(self.rows, self.text):
            yield start, start + rows, text
            start += rows


def pad_text(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pads dim 1 of a [rows, text, ...] tensor to `length`."""
    if x.shape[1] == length:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], length - x.shape[1], *x.shape[2:]))], dim=1)


class SegmentedForward:
    """Installs segment-aware `forward`s on the transformer's Linear modules and attention processors.

    is_text_linear(name) -> True for Linear modules that take the text (encoder) stream.
    trim_attention(kwargs, text_len) -> kwargs of one attention call cut to a segment's text length
    (called with the row-sliced kwargs; the processor is then called with them).
    Outside `layout(...)` (or when a call does not carry all rows) everything runs unchanged.
    """

    def __init__(self, model: torch.nn.Module, is_text_linear: Callable[[str], bool],
                 trim_attention: Callable[[dict, int], dict]):
        self._local = threading.local()
        self.trim_attention = trim_attention
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear):
                module.forward = self._linear(module, is_text_linear(name))
            elif isinstance(module, torch.nn.modules.conv._ConvNd):
                module.forward = self._rows(module.forward)
        model.set_attn_processor({name: _segmented(proc)(self, proc) for name, proc in model.attn_processors.items()})

    @contextmanager
    def layout(self, rows: list[int], text: list[int]):
        self._local.layout = Layout(tuple(rows), tuple(text))
        try:
            yield
        finally:
            self._local.layout = None

    def current(self, batch: int) -> Layout | None:
        layout = getattr(self._local, "layout", None)
        return layout if layout is not None and len(layout.rows) > 1 and batch == layout.total else None

    def _linear(self, module: torch.nn.Linear, text: bool):
        def forward(x: torch.Tensor) -> torch.Tensor:
            layout = self.current(x.shape[0])
            if layout is None:
                return F.linear(x, module.weight, module.bias)
            parts = []
            for start, stop, length in layout.spans():
                part = x[start:stop]
                if text and x.dim() == 3:
                    parts.append(pad_text(F.linear(part[:, :length], module.weight, module.bias), x.shape[1]))
                else:
                    parts.append(F.linear(part, module.weight, module.bias))
            return torch.cat(parts)
        return forward

    def _rows(self, forward: Callable) -> Callable:
        """`forward` once per segment's rows (modules that do not take the text stream)."""
        def segmented(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            layout = self.current(x.shape[0])
            if layout is None:
                return forward(x, *args, **kwargs)
            return torch.cat([forward(x[start:stop], *args, **kwargs) for start, stop, _ in layout.spans()])
        return segmented


class _SegmentedProcessor:
    """Calls the library's attention processor once per segment with that segment's rows and text."""

    def __init__(self, owner: SegmentedForward, inner):
        self.owner, self.inner = owner, inner

    def __call__(self, attn, hidden_states, *args, **kwargs):
        layout = self.owner.current(hidden_states.shape[0])
        if layout is None or args:
            return self.inner(attn, hidden_states, *args, **kwargs)
        outputs = []
        for start, stop, length in layout.spans():
            sliced = {k: (v[start:stop] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == layout.total
                          else v) for k, v in kwargs.items()}
            outputs.append(self.inner(attn, hidden_states[start:stop], **self.owner.trim_attention(sliced, length)))
        if isinstance(outputs[0], tuple):  # (image stream, text stream): re-pad the text stream
            width = max(o[1].shape[1] for o in outputs)
            return torch.cat([o[0] for o in outputs]), torch.cat([pad_text(o[1], width) for o in outputs])
        return torch.cat(outputs)


def _segmented(processor) -> type:
    """A `_SegmentedProcessor` subclass whose `__call__` shows the wrapped processor's signature (diffusers'
    `Attention` passes a processor only the keyword arguments its signature names)."""
    def call(self, *args, **kwargs):
        return _SegmentedProcessor.__call__(self, *args, **kwargs)

    call.__signature__ = inspect.signature(type(processor).__call__)
    return type(f"Segmented{type(processor).__name__}", (_SegmentedProcessor,), {"__call__": call})
