"""One diffusers checkpoint directory, as the families whose stages each load only their own parts read it
(Wan, Stable Audio): its JSON configs (torch-free), one component at a time, and the writing of a tiny
random-weight one into the model home.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

from omni_backends.paths import TINY_COMPLETE_MARKER


def read_config(path: str | Path, name: str, family: str) -> dict:
    """The JSON file `name` (e.g. "vae/config.json") of checkpoint `path`. Raises FileNotFoundError naming
    the `family` ("Wan") whose checkpoint it is not."""
    file = Path(path) / name
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {name} (not a {family} diffusers checkpoint)")
    return json.loads(file.read_text())


def load_component(path: str | Path, name: str, classes: Mapping[str, str], family: str):
    """Component folder `name` of checkpoint `path`: `classes[name]` ("diffusers.Class" or
    "transformers.Class", loaded with from_pretrained and put in eval mode), "tokenizer" (AutoTokenizer) or
    "scheduler" (the class its scheduler_config.json names). Raises FileNotFoundError for a missing folder,
    ValueError for a name that is none of these."""
    folder = Path(path) / name
    if not folder.is_dir():
        raise FileNotFoundError(f"{path} has no {name}/ folder (not a {family} diffusers checkpoint)")
    if name in classes:
        library, _, cls = classes[name].partition(".")
        return getattr(importlib.import_module(library), cls).from_pretrained(path, subfolder=name).eval()
    if name == "tokenizer":
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    if name == "scheduler":
        import diffusers

        kind = read_config(path, "scheduler/scheduler_config.json", family)["_class_name"]
        return getattr(diffusers, kind).from_pretrained(path, subfolder=name)
    raise ValueError(f"unknown {family} component {name!r}")


def write_tiny(out_dir: str | os.PathLike, version: str, save: Callable[[Path], None]) -> Path:
    """Writes a tiny checkpoint with `save(folder)` (e.g. a pipeline's save_pretrained) into `out_dir` unless
    the completion marker there names `version`; through a temporary sibling, so that a half-written directory
    is never taken for a finished one. Returns the path."""
    out = Path(out_dir)
    marker = out / TINY_COMPLETE_MARKER
    if marker.exists() and marker.read_text() == version:
        return out
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    save(partial)
    (partial / TINY_COMPLETE_MARKER).write_text(version)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def tiny_cli(doc: str, write: Callable[[str], Path]) -> None:
    """`python -m <family>.checkpoint OUT_DIR`: runs `write(OUT_DIR)` and prints the path (help: `doc`'s first
    paragraph)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("out_dir")
    print(write(parser.parse_args().out_dir))
