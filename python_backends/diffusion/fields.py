"""Checking a diffusion orchestrator's REQUEST fields (torch-free): numbers in a range, with a 400 naming the
field (omni_backends.errors.RequestError)."""
from __future__ import annotations

from omni_backends.errors import RequestError

MAX_SEED = 2**63 - 1


def number(body: dict, name: str, default, low, high, kind=int):
    """body[name] (default when absent or null) checked to be a `kind` (int: no floats; float: ints too; never a
    bool) in [low, high], returned as `kind`. Raises RequestError (param `name`)."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or not low <= value <= high:
        raise RequestError(f"{name} must be {'an integer' if kind is int else 'a number'} in [{low}, {high}], "
                           f"got {value!r}", param=name, code="invalid_value")
    return kind(value)
