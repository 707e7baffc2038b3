"""Deploy files: one YAML per deployment -> a rendered Triton model repository (no model code here).

    ./scripts/deploy deploy/qwen3_omni_h200.yaml [--out var/deploy/qwen3_omni_h200]   # render only
    ./scripts/serve --deploy deploy/qwen3_omni_h200.yaml      # renders, then serves the rendered repository

The idea of vLLM-Omni's stage deploy YAML and TensorRT-LLM's `fill_template.py`: the checked-in
`model_repository/` is the CPU default; a deploy file names, per stage, the device (`cpu` or
`cuda:N` -> `instance_group { kind: KIND_GPU gpus: [N] }`), the instance count, the dtype, the engine
and its sizes, and the rendered copy of the pipeline's models carries those as `parameters`. Values
may be `${VAR}` / `${VAR:-default}` placeholders filled from the environment.

File layout (every key optional except `pipeline`):

    pipeline: qwen3_omni
    layout: stages                          # or colocated: every stage in one process (below)
    checkpoint: qwen3_omni_30b_a3b_random   # preset name or directory (relative: $OMNI_MODEL_HOME)
    kernels: true                           # omni_kernels Triton kernels on CUDA stages
    gpu_tensors: true                       # thinker -> talker hidden states stay on the GPU (DLPack)
    stages:
      thinker:  {device: cuda:0, instances: 1, dtype: bfloat16, engine: static, cuda_graphs: true,
                 max_running: 32, max_len: 4096, prefill_chunk: 512, max_tokens: 256}
      talker:   {device: cuda:0, engine: static, max_running: 32, max_len: 4608, max_frames: 4095, max_batch: 8}
      code2wav: {device: cuda:0, chunk_frames: 25, first_chunk_frames: 5, left_context_frames: 25}
      orchestrator: {default_voice: ethan, sm_split: off}   # sm_split: colocated only, e.g. thinker:96,talker:36

`layout: colocated` renders ONE model instead of one per stage: the pipeline's co-located model
(`model_repository/qwen3_omni_colocated`, served under the entry name `qwen3_omni`, same tensors for
clients) holding every engine in one process, each on its own thread and CUDA stream, so their kernels
run concurrently instead of time-slicing the GPU between stage processes. Every stage must then name
the same device; each stage's settings become parameters `<stage>.<key>` of that model (the shared `checkpoint`,
`kernels` and `threads` -- one torch thread count for the process, so stages that give different ones are
refused -- stay unprefixed); `instances` and `max_batch` of the inner stages and `gpu_tensors` have no meaning there.

Errors (`DeployError`) are one line naming the file and the key: unknown keys, keys given twice, YAML
anchors / aliases, unfilled placeholders, bad values (an integer outside its `RANGES`, a static talker whose
`max_len` cannot hold the thinker's prompts), a value of the wrong type anywhere (a list or mapping where a
name, number or stage mapping belongs), a file that cannot be read, is not a regular file, is larger than
`MAX_FILE_BYTES` or is not UTF-8. Rendered string values are escaped as protobuf text (backslash, quote, newline).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCE_REPOSITORY = ROOT / "model_repository"

# stage -> Triton model, per pipeline.
PIPELINE_STAGES = {
    "qwen3_omni": {"thinker": "qwen3_omni_thinker", "talker": "qwen3_omni_talker",
                   "code2wav": "qwen3_omni_code2wav", "orchestrator": "qwen3_omni"},
}
# pipeline -> (source folder of its co-located model, the stage that names the served model)
COLOCATED = {"qwen3_omni": ("qwen3_omni_colocated", "orchestrator")}
LAYOUTS = ("stages", "colocated")
SHARED_PARAMETERS = ("checkpoint", "kernels", "threads")   # unprefixed in a co-located model (one process)
INT, BOOL, STR = "int", "bool", "str"
DTYPES = ("auto", "bfloat16", "float16", "float32")
ENGINES = ("dynamic", "static")
_ENGINE_KEYS = {"engine": ENGINES, "cuda_graphs": BOOL, "max_len": INT, "prefill_chunk": INT, "max_running": INT,
                "prefill_graph_tokens": INT}
# Keys every stage accepts (rendered into instance_group / parameters) and the per-stage parameter keys.
COMMON_KEYS = {"device": STR, "instances": INT, "dtype": DTYPES, "threads": INT}
STAGE_KEYS = {
    "thinker": {**_ENGINE_KEYS, "max_tokens": INT},
    "talker": {**_ENGINE_KEYS, "max_frames": INT, "max_batch": INT},
    "code2wav": {"chunk_frames": INT, "first_chunk_frames": INT, "left_context_frames": INT, "max_batch": INT,
                 "cuda_graphs": BOOL},
    "orchestrator": {"default_voice": STR, "sm_split": STR},
}
TOP_KEYS = {"pipeline", "layout", "checkpoint", "kernels", "gpu_tensors", "stages"}
# Allowed (lowest, highest) of every integer key: what the stages can use, and bounds that keep a typo from
# starting 10^8 stub processes or sizing a cache past memory. `max_len` etc. are tokens, `*_frames` codec frames
# (12.5 per second of audio), `threads` torch intra-op threads.
RANGES = {"instances": (1, 64), "max_batch": (1, 1024), "threads": (1, 256), "max_running": (1, 1024),
          "max_len": (2, 1 << 20), "prefill_chunk": (0, 1 << 20), "prefill_graph_tokens": (0, 1 << 20),
          "max_tokens": (1, 1 << 20), "max_frames": (1, 1 << 20), "chunk_frames": (1, 4096),
          "first_chunk_frames": (1, 4096), "left_context_frames": (0, 4096)}
DEFAULT_MAX_LEN = 4096   # EngineOptions.max_len's default (omni_backends/engine/options.py)
# Talker positions = the prompt's user-turn tokens + TALKER_PROMPT_EXTRA (+ the frames it speaks), so a static
# talker's max_len must be at least the thinker's + this to take every prompt the thinker takes.
TALKER_PROMPT_EXTRA = 9
MAX_FILE_BYTES = 1 << 20   # a deploy file is a few hundred bytes; anything past this is the wrong file
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
DEVICE = re.compile(r"^(cpu|cuda:(\d+))$")


class DeployError(ValueError):
    """A bad deploy file; the message is one line naming the file and the key."""


@dataclass
class StageSpec:
    model: str
    source: str | None = None   # folder under model_repository/ to render from (default: `model`)
    kind: str = "KIND_CPU"
    gpus: tuple[int, ...] = ()
    instances: int = 1
    max_batch: int | None = None
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass
class Deployment:
    """A parsed deploy file: the pipeline, its checkpoint, and one StageSpec per Triton model."""

    name: str
    pipeline: str
    checkpoint: str | None
    stages: dict[str, StageSpec]
    layout: str = "stages"

    @property
    def models(self) -> list[str]:
        return [spec.model for spec in self.stages.values()]

    @property
    def uses_gpu(self) -> bool:
        return any(spec.kind == "KIND_GPU" for spec in self.stages.values())


def load(path: str | os.PathLike, environ: dict[str, str] | None = None) -> Deployment:
    """Parse and validate a deploy file. Raises DeployError (one line, naming the key)."""
    path = Path(path)
    raw = _parse(path, _read(path))
    if not isinstance(raw, dict):
        raise DeployError(f"{path}: the deploy file must be a mapping with at least 'pipeline'")
    raw = _fill(raw, os.environ if environ is None else environ, path, "")
    _check_keys(raw, TOP_KEYS, path, "")
    pipeline = raw.get("pipeline")
    if not isinstance(pipeline, str) or pipeline not in PIPELINE_STAGES:   # a list or mapping was a TypeError
        raise DeployError(f"{path}: pipeline: must be one of {sorted(PIPELINE_STAGES)}, got {pipeline!r}")
    stages_raw = {} if raw.get("stages") is None else raw["stages"]   # `stages: false` / `[]` are errors too
    if not isinstance(stages_raw, dict):
        raise DeployError(f"{path}: stages: must be a mapping of stage name -> settings, got {stages_raw!r}")
    _check_keys(stages_raw, set(PIPELINE_STAGES[pipeline]), path, "stages.")
    shared = {}
    for key in ("kernels", "gpu_tensors"):
        if key in raw:
            shared[key] = _value(raw[key], BOOL, path, key)
    checkpoint = raw.get("checkpoint")
    if checkpoint is not None:
        checkpoint = _value(checkpoint, STR, path, "checkpoint")
        shared["checkpoint"] = checkpoint
    layout = raw.get("layout", "stages")
    if not isinstance(layout, str) or layout not in LAYOUTS or (layout == "colocated" and pipeline not in COLOCATED):
        known = [name for name in LAYOUTS if name == "stages" or pipeline in COLOCATED]
        raise DeployError(f"{path}: layout: must be one of {', '.join(known)}, got {layout!r}")
    stages = {name: _stage(name, model, {} if stages_raw.get(name) is None else stages_raw[name], shared, path)
              for name, model in PIPELINE_STAGES[pipeline].items()}
    _check_talker_len(stages_raw, stages, path)
    if layout == "colocated":
        stages = _colocate(pipeline, stages, path)
    return Deployment(name=path.stem, pipeline=pipeline, checkpoint=checkpoint, stages=stages, layout=layout)


def _read(path: Path) -> str:
    """The text of a deploy file: a regular file of at most MAX_FILE_BYTES, UTF-8 (a FIFO, /dev/zero or a
    checkpoint named by mistake are refused before reading)."""
    try:
        info = path.stat()   # before open(): opening a FIFO waits for a writer
        if not stat.S_ISREG(info.st_mode):
            raise DeployError(f"{path}: cannot read the deploy file: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise DeployError(f"{path}: cannot read the deploy file: larger than {MAX_FILE_BYTES >> 20} MiB "
                              f"({info.st_size} bytes)")
        with open(path, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise DeployError(f"{path}: cannot read the deploy file: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:   # grew since the stat
        raise DeployError(f"{path}: cannot read the deploy file: larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DeployError(f"{path}: cannot read the deploy file: not UTF-8 (byte {exc.object[exc.start]:#04x} "
                          f"at offset {exc.start})") from None


class _Loader(yaml.SafeLoader):
    """safe_load without anchors and aliases (a deploy file never needs them; nested aliases made `_fill`
    visit 9^9 nodes): the first one raises DeployError naming its key and line."""

    path: Path
    keys: list[str]

    def compose_node(self, parent, index):
        event = self.peek_event()
        key = index.value if isinstance(index, yaml.ScalarNode) else f"[{index}]" if isinstance(index, int) else None
        if key is not None:
            self.keys.append(key)
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            where = ".".join(self.keys).replace(".[", "[") or "(top)"
            mark = f"*{event.anchor}" if isinstance(event, yaml.AliasEvent) else f"&{event.anchor}"
            raise DeployError(f"{self.path}: {where}: YAML anchors and aliases are not allowed in a deploy file "
                              f"({mark} on line {event.start_mark.line + 1})")
        node = super().compose_node(parent, index)
        if key is not None:
            self.keys.pop()
        return node


def _parse(path: Path, text: str):
    """The YAML document of a deploy file as Python values. Raises DeployError for invalid YAML, anchors or
    aliases, and a key given twice in one mapping (safe_load keeps the last silently)."""
    loader = _Loader(text)
    loader.path, loader.keys = path, []
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicates(node, path, "")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise DeployError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:   # absurd nesting
        raise DeployError(f"{path}: not valid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def _check_duplicates(node: yaml.Node, path: Path, where: str) -> None:
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, path, f"{where}[{i}]")
    if not isinstance(node, yaml.MappingNode):
        return
    lines = {}
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        dotted = f"{where}{'.' if where else ''}{name}"
        if name is not None:
            line = key.start_mark.line + 1
            if name in lines:
                seen = f"lines {lines[name]} and {line}" if lines[name] != line else f"both on line {line}"
                raise DeployError(f"{path}: {dotted}: given twice ({seen})")
            lines[name] = line
        _check_duplicates(value, path, dotted)


def _check_talker_len(stages_raw: dict, stages: dict[str, StageSpec], path: Path) -> None:
    """A static talker's max_len must hold every prompt the thinker accepts: the thinker's max_len (default
    DEFAULT_MAX_LEN) + TALKER_PROMPT_EXTRA positions; the dynamic engine has no max_len."""
    if "talker" not in stages or stages["talker"].parameters.get("engine") != "static":
        return
    given = "max_len" in (stages_raw.get("talker") or {})
    talker = int(stages["talker"].parameters.get("max_len", DEFAULT_MAX_LEN))
    thinker = int(stages["thinker"].parameters.get("max_len", DEFAULT_MAX_LEN))
    if talker < thinker + TALKER_PROMPT_EXTRA:
        raise DeployError(f"{path}: stages.talker.max_len: must be >= stages.thinker.max_len + {TALKER_PROMPT_EXTRA} "
                          f"= {thinker + TALKER_PROMPT_EXTRA} (a talker prompt is the thinker's prompt + "
                          f"{TALKER_PROMPT_EXTRA} positions), got {talker}{'' if given else ' (the default)'}")


def _colocate(pipeline: str, stages: dict[str, StageSpec], path: Path) -> dict[str, StageSpec]:
    """The one model of the co-located layout: the entry stage's device and instances, its parameters
    unprefixed, every other stage's as `<stage>.<key>` (SHARED_PARAMETERS unprefixed; `threads` must agree)."""
    source, entry_stage = COLOCATED[pipeline]
    devices = {name: (spec.kind, spec.gpus) for name, spec in stages.items()}
    if len(set(devices.values())) > 1:
        named = ", ".join(f"{name}: {'cpu' if not gpus else f'cuda:{gpus[0]}'}" for name, (_, gpus) in devices.items())
        raise DeployError(f"{path}: layout: colocated runs every stage in one process, so every stage needs the "
                          f"same device ({named})")
    threads = [(name, spec.parameters["threads"]) for name, spec in stages.items() if "threads" in spec.parameters]
    first, value = threads[0] if threads else (None, None)
    name, other = next(((n, v) for n, v in threads if v != value), (None, None))
    if name is not None:   # torch.set_num_threads is one setting of the process
        raise DeployError(f"{path}: stages.{name}.threads: layout: colocated runs every stage in one process with one "
                          f"torch thread count, so every stage that gives threads needs the same value "
                          f"(stages.{first}.threads: {value}, here {other})")
    entry = stages[entry_stage]
    spec = StageSpec(model=entry.model, source=source, kind=entry.kind, gpus=entry.gpus, instances=entry.instances)
    spec.parameters = {k: v for k, v in entry.parameters.items() if k != "gpu_tensors"}
    for name, stage in stages.items():
        if name == entry_stage:
            continue
        for key, value in stage.parameters.items():
            if key in SHARED_PARAMETERS:
                spec.parameters[key] = value
            elif key not in ("gpu_tensors", "FORCE_CPU_ONLY_INPUT_TENSORS"):
                spec.parameters[f"{name}.{key}"] = value
    return {entry_stage: spec}


def _stage(name: str, model: str, raw, shared: dict, path: Path) -> StageSpec:
    where = f"stages.{name}"
    if not isinstance(raw, dict):
        raise DeployError(f"{path}: {where}: must be a mapping of settings, got {raw!r}")
    allowed = {**COMMON_KEYS, **STAGE_KEYS[name]}
    _check_keys(raw, set(allowed), path, f"{where}.")
    values = {key: _value(value, allowed[key], path, f"{where}.{key}") for key, value in raw.items()}
    spec = StageSpec(model=model)
    device = values.pop("device", "cpu")
    match = DEVICE.match(device)
    if not match:
        raise DeployError(f"{path}: {where}.device: must be 'cpu' or 'cuda:N', got {device!r}")
    if match.group(2) is not None:
        spec.kind, spec.gpus = "KIND_GPU", (int(match.group(2)),)
    for key in (key for key in values if allowed[key] == INT):
        low, high = RANGES[key]
        if not low <= values[key] <= high:
            raise DeployError(f"{path}: {where}.{key}: must be >= {low} and <= {high}, got {values[key]}")
    spec.instances = values.pop("instances", 1)
    spec.max_batch = values.pop("max_batch", None)
    params = {k: v for k, v in shared.items() if k != "gpu_tensors" or name in ("thinker", "orchestrator")}
    if name in ("code2wav", "orchestrator"):
        params.pop("kernels", None)
    params.update(values)
    spec.parameters = {key: _text(value) for key, value in params.items()}
    if spec.kind == "KIND_GPU" and name == "talker":
        spec.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"] = "no"   # TEXT_EMBEDS arrive as GPU tensors
    return spec


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _check_keys(raw: dict, allowed: set[str], path: Path, where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        raise DeployError(f"{path}: {where}{unknown[0]}: unknown key (known: {', '.join(sorted(allowed))})")


def _value(value, kind, path: Path, where: str):
    if isinstance(kind, tuple):
        if not isinstance(value, str) or value not in kind:
            raise DeployError(f"{path}: {where}: must be one of {', '.join(kind)}, got {value!r}")
        return value
    if kind == BOOL:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise DeployError(f"{path}: {where}: must be true or false, got {value!r}")
        return value
    if kind == INT:
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise DeployError(f"{path}: {where}: must be an integer, got {value!r}")
        return value
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or value == "":
        raise DeployError(f"{path}: {where}: must be a non-empty string, got {value!r}")
    return str(value)


def _fill(node, environ, path: Path, where: str):
    """Replace ${VAR} / ${VAR:-default} in every string value; an unset VAR without default is an error."""
    if isinstance(node, dict):
        return {k: _fill(v, environ, path, f"{where}{'.' if where else ''}{k}") for k, v in node.items()}
    if isinstance(node, list):
        return [_fill(v, environ, path, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise DeployError(f"{path}: {where}: placeholder ${{{name}}} is not set (export {name} or give a "
                          f"default: ${{{name}:-value}})")

    filled = PLACEHOLDER.sub(substitute, node)
    if "${" in filled:
        raise DeployError(f"{path}: {where}: malformed placeholder in {node!r}")
    return filled


# ---- rendering -------------------------------------------------------------------------------------

def render(deployment: Deployment, out_dir: str | os.PathLike, source: Path = SOURCE_REPOSITORY) -> Path:
    """Write the pipeline's models into `out_dir` (replaced) with the deployment's settings; returns it."""
    out = Path(out_dir)
    try:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for spec in deployment.stages.values():
            shutil.copytree(source / (spec.source or spec.model), out / spec.model,
                            ignore=shutil.ignore_patterns("__pycache__"))
            config = out / spec.model / "config.pbtxt"
            config.write_text(render_config(config.read_text(), spec))
    except (OSError, shutil.Error) as exc:
        raise DeployError(f"{out}: cannot render the deploy file's models into it: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    return out


def render_config(text: str, spec: StageSpec) -> str:
    """A config.pbtxt with the StageSpec applied: instance_group, max_batch_size, parameters (replaced
    in place when present, appended otherwise)."""
    gpus = f" gpus: [ {', '.join(map(str, spec.gpus))} ]" if spec.gpus else ""
    group = f"instance_group [ {{ count: {spec.instances} kind: {spec.kind}{gpus} }} ]"
    text, found = re.subn(r"(?m)^instance_group \[.*\]$", group, text)
    if not found:
        text = text.rstrip("\n") + "\n" + group + "\n"
    if spec.max_batch is not None:
        text = re.sub(r"(?m)^max_batch_size: \d+$", f"max_batch_size: {spec.max_batch}", text)
    return set_parameters(text, spec.parameters)


def set_parameters(text: str, parameters: dict[str, str]) -> str:
    """A config.pbtxt with `parameters` set: each replaces the line of its key, or is appended. Values are
    escaped as protobuf text strings (a checkpoint path with `"` or `\\` parses back to itself)."""
    for key, value in parameters.items():
        line = f'parameters {{ key: "{_escape(key)}" value {{ string_value: "{_escape(value)}" }} }}'
        pattern = rf'(?m)^parameters {{ key: "{re.escape(_escape(key))}" .*$'
        text, found = re.subn(pattern, lambda _: line, text)
        if not found:
            text = text.rstrip("\n") + "\n" + line + "\n"
    return text


def _escape(value: str) -> str:
    """`value` as the inside of a protobuf text-format string literal (one line)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")


def render_parameters(repositories: list[Path], models: list[str], parameters: dict[str, dict[str, str]],
                      out_dir: str | os.PathLike) -> Path:
    """A run copy of `models` (each from the first of `repositories` that holds it) in `out_dir`, with
    `parameters[model]` set in that model's config.pbtxt (e.g. {"voice_tts": {"engine": "piper"}}); returns
    out_dir. Raises DeployError naming a model that no repository holds or a parameter for a model not copied."""
    out = Path(out_dir)
    unknown = sorted(set(parameters) - set(models))
    if unknown:
        raise DeployError(f"{', '.join(unknown)}: not among the models to serve ({', '.join(models)})")
    for model in models:
        source = next((r / model for r in repositories if (r / model / "config.pbtxt").is_file()), None)
        if source is None:
            raise DeployError(f"model {model!r} is in none of the repositories {', '.join(map(str, repositories))}")
        shutil.copytree(source, out / model, ignore=shutil.ignore_patterns("__pycache__"))
        config = out / model / "config.pbtxt"
        config.write_text(set_parameters(config.read_text(), parameters.get(model, {})))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omni_frontend.deploy", description="Render a deploy file into a "
                                     "Triton model repository.")
    parser.add_argument("deploy_file")
    parser.add_argument("--out", help="output folder (default var/deploy/<file stem>)")
    args = parser.parse_args(argv)
    try:
        deployment = load(args.deploy_file)
        out = render(deployment, args.out or ROOT / "var" / "deploy" / deployment.name)
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
