"""Engine choice and sizes of an autoregressive stage, parsed from its model-config parameters."""
from __future__ import annotations

from dataclasses import dataclass

import torch

ENGINES = ("dynamic", "static")


@dataclass(frozen=True)
class EngineOptions:
    """How a stage decodes.

    Fields:
        engine: "dynamic" (transformers forward with a `DynamicCache` per request: the CPU default) or
            "static" (a preallocated `StaticKVCache`, decode steps captured as CUDA graphs: GPU serving).
        cuda_graphs: capture CUDA graphs with the static engine (False: the same steps, eagerly).
        max_len: static engine: most cached tokens per request (prompt + generated).
        prefill_chunk: most prompt tokens prefilled per engine iteration (0: no limit), so a long prompt
            does not stall the streams decoding beside it (both engines: chunked prefill).
        prefill_graph_tokens: static engine on CUDA with cuda_graphs: a prompt of up to this many tokens arriving
            alone is prefilled by replaying a CUDA graph of its length bucket (`engine.prefill_graphs`; thinker and
            talker prompts); 0: eager prefills only.

    Raises:
        ValueError: naming the field, on an unknown engine or a non-positive size.
    """

    engine: str = "dynamic"
    cuda_graphs: bool = True
    max_len: int = 4096
    prefill_chunk: int = 512
    prefill_graph_tokens: int = 256

    def graph_prefill_tokens(self, device: torch.device) -> int:
        """`prefill_graph_tokens` where prefill graphs apply (the static engine with graphs, on CUDA), else 0."""
        usable = self.engine == "static" and self.cuda_graphs and device.type == "cuda"
        return self.prefill_graph_tokens if usable else 0

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")
        if self.prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0, got {self.prefill_chunk}")
        if self.prefill_graph_tokens < 0:
            raise ValueError(f"prefill_graph_tokens must be >= 0, got {self.prefill_graph_tokens}")

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> "EngineOptions":
        """From config.pbtxt parameters `engine`, `cuda_graphs` (true/false), `max_len`, `prefill_chunk`,
        `prefill_graph_tokens` (missing or empty: the defaults). Raises ValueError naming the parameter."""
        defaults = cls()
        values = {}
        for name in ("max_len", "prefill_chunk", "prefill_graph_tokens"):
            raw = (parameters.get(name) or "").strip()
            try:
                values[name] = int(raw) if raw else getattr(defaults, name)
            except ValueError:
                raise ValueError(f"config parameter {name!r} must be an integer, got {raw!r}") from None
        values["engine"] = (parameters.get("engine") or "").strip() or defaults.engine
        values["cuda_graphs"] = parse_bool(parameters.get("cuda_graphs"), "cuda_graphs", defaults.cuda_graphs)
        return cls(**values)


def parse_bool(raw: str | None, name: str, default: bool) -> bool:
    """A config-parameter boolean: true/false/yes/no/1/0 (case-insensitive); missing or empty: default.
    Raises ValueError naming the parameter."""
    text = (raw or "").strip().lower()
    if not text:
        return default
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise ValueError(f"config parameter {name!r} must be true or false, got {raw!r}")
