"""Deploy files (deploy/*.yaml) -> rendered model repositories; bad files give one line naming the key."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_frontend import deploy

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "d.yaml"
    path.write_text(text)
    return path


def test_h200_deploy_renders_gpu_stages(tmp_path):
    deployment = deploy.load(ROOT / "deploy" / "qwen3_omni_h200.yaml", environ={"OMNI_LAYOUT": "stages"})
    assert deployment.pipeline == "qwen3_omni" and deployment.checkpoint == "qwen3_omni_30b_a3b_random"
    out = deploy.render(deployment, tmp_path / "repo")
    assert sorted(p.name for p in out.iterdir()) == sorted(deployment.models)
    thinker = (out / "qwen3_omni_thinker" / "config.pbtxt").read_text()
    assert "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]" in thinker and "KIND_CPU" not in thinker
    for key, value in (("engine", "static"), ("dtype", "bfloat16"), ("kernels", "true"), ("gpu_tensors", "true"),
                       ("checkpoint", "qwen3_omni_30b_a3b_random"), ("max_len", "4096")):
        assert f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}' in thinker
    assert thinker.count('key: "checkpoint"') == 1   # replaced in place, not appended twice
    talker = (out / "qwen3_omni_talker" / "config.pbtxt").read_text()
    assert 'key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" }' in talker
    assert "max_batch_size: 32" in talker and 'key: "gpu_tensors"' not in talker
    assert (out / "qwen3_omni_thinker" / "1" / "model.py").is_file()
    # the checked-in repository stays the CPU default
    assert "KIND_CPU" in (ROOT / "model_repository" / "qwen3_omni_thinker" / "config.pbtxt").read_text()


def test_colocated_layout_renders_one_model_with_every_stage_setting(tmp_path):
    deployment = deploy.load(ROOT / "deploy" / "qwen3_omni_h200.yaml", environ={})   # the file's default layout
    assert deployment.layout == "colocated" and deployment.models == ["qwen3_omni"]
    out = deploy.render(deployment, tmp_path / "repo")
    assert [p.name for p in out.iterdir()] == ["qwen3_omni"]
    config = (out / "qwen3_omni" / "config.pbtxt").read_text()
    assert "instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]" in config and "\nname:" not in config
    for key, value in (("checkpoint", "qwen3_omni_30b_a3b_random"), ("kernels", "true"), ("default_voice", "ethan"),
                       ("thinker.engine", "static"), ("thinker.max_len", "4096"), ("thinker.dtype", "bfloat16"),
                       ("talker.max_len", "4608"), ("talker.max_frames", "4095"), ("code2wav.first_chunk_frames", "3")):
        assert f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}' in config
    assert config.count('key: "code2wav.first_chunk_frames"') == 1   # the template's default replaced in place
    assert "gpu_tensors" not in config and "FORCE_CPU_ONLY_INPUT_TENSORS" not in config
    assert "colocated_model" in (out / "qwen3_omni" / "1" / "model.py").read_text()


def test_sm_split_reaches_the_colocated_model_from_the_environment(tmp_path):
    path = ROOT / "deploy" / "qwen3_omni_h200.yaml"
    for environ, value in (({}, "off"), ({"OMNI_SM_SPLIT": "thinker:96,talker:36"}, "thinker:96,talker:36")):
        config = (deploy.render(deploy.load(path, environ=environ), tmp_path / value) / "qwen3_omni"
                  / "config.pbtxt").read_text()
        assert f'parameters {{ key: "sm_split" value {{ string_value: "{value}" }} }}' in config


def test_placeholders_are_filled_from_the_environment(tmp_path):
    path = _write(tmp_path, "pipeline: qwen3_omni\ncheckpoint: ${CKPT}\nkernels: ${K:-false}\n"
                            "stages: {thinker: {device: 'cuda:${GPU:-1}', instances: 2}}\n")
    deployment = deploy.load(path, environ={"CKPT": "/models/q"})
    spec = deployment.stages["thinker"]
    assert (spec.kind, spec.gpus, spec.instances) == ("KIND_GPU", (1,), 2)
    assert spec.parameters["checkpoint"] == "/models/q" and spec.parameters["kernels"] == "false"
    assert deployment.stages["code2wav"].kind == "KIND_CPU" and "kernels" not in deployment.stages["code2wav"].parameters


@pytest.mark.parametrize("text, message", [
    ("pipeline: qwen3_omni\nstages: {thinker: {devise: cpu}}\n", "stages.thinker.devise: unknown key"),
    ("pipeline: qwen3_omni\ncheckpint: x\n", "checkpint: unknown key"),
    ("pipeline: qwen3_omni\nstages: {talker2: {}}\n", "stages.talker2: unknown key"),
    ("pipeline: qwen3_omni\ncheckpoint: ${NOPE}\n", "checkpoint: placeholder ${NOPE} is not set"),
    ("pipeline: qwen3_omni\nstages: {thinker: {device: gpu0}}\n", "stages.thinker.device: must be 'cpu' or 'cuda:N'"),
    ("pipeline: qwen3_omni\nstages: {thinker: {max_len: lots}}\n", "stages.thinker.max_len: must be an integer"),
    ("pipeline: qwen3_omni\nstages: {thinker: {engine: turbo}}\n", "stages.thinker.engine: must be one of"),
    ("pipeline: qwen3_omni\nstages: {talker: {instances: 0}}\n", "stages.talker.instances: must be >= 1"),
    ("pipeline: qwen3_omni\nkernels: sometimes\n", "kernels: must be true or false"),
    ("pipeline: voice2\n", "pipeline: must be one of"),
    ("pipeline: qwen3_omni\nlayout: mixed\n", "layout: must be one of stages, colocated"),
    ("pipeline: qwen3_omni\nlayout: colocated\nstages: {thinker: {device: 'cuda:0'}}\n",
     "layout: colocated runs every stage in one process, so every stage needs the same device (thinker: cuda:0"),
    ("- just a list\n", "must be a mapping"),
    # values of the wrong YAML type (the outside test's `pipeline: [qwen3_omni]` was a TypeError traceback)
    ("pipeline: [qwen3_omni]\n", "pipeline: must be one of ['qwen3_omni'], got ['qwen3_omni']"),
    ("pipeline: {a: 1}\n", "pipeline: must be one of"),
    ("pipeline: qwen3_omni\nlayout: [stages]\n", "layout: must be one of"),
    ("pipeline: qwen3_omni\nstages: [thinker]\n", "stages: must be a mapping"),
    ("pipeline: qwen3_omni\nstages: false\n", "stages: must be a mapping"),
    ("pipeline: qwen3_omni\nstages: {thinker: [cpu]}\n", "stages.thinker: must be a mapping"),
    ("pipeline: qwen3_omni\nstages: {talker: 0}\n", "stages.talker: must be a mapping"),
    ("pipeline: qwen3_omni\nstages: {thinker: {dtype: [bfloat16]}}\n", "stages.thinker.dtype: must be one of"),
    # anchors / aliases are refused while composing (nested aliases made the loader visit 9^9 nodes)
    ("a: &a [*a]\n", "a: YAML anchors and aliases are not allowed in a deploy file (&a on line 1)"),
    ("pipeline: qwen3_omni\nstages:\n  thinker: {threads: 2}\n  talker: {threads: *t}\n",
     "stages.talker.threads: YAML anchors and aliases are not allowed in a deploy file (*t on line 4)"),
    # a key given twice (safe_load kept the last one silently)
    ("pipeline: qwen3_omni\ncheckpoint: qwen3_omni_tiny\ncheckpoint: /elsewhere/ckpt\n",
     "checkpoint: given twice (lines 2 and 3)"),
    ("pipeline: qwen3_omni\nstages:\n  thinker: {device: cpu}\n  thinker: {device: cpu, threads: 2}\n",
     "stages.thinker: given twice (lines 3 and 4)"),
    ("pipeline: qwen3_omni\nstages:\n  thinker: {threads: 1, threads: 2}\n",
     "stages.thinker.threads: given twice (both on line 3)"),
    # sizes a stage cannot use (they failed inside tritonserver, or served 500s: max_batch 0, max_tokens 0)
    ("pipeline: qwen3_omni\nstages: {talker: {max_batch: 0}}\n",
     "stages.talker.max_batch: must be >= 1 and <= 1024, got 0"),
    ("pipeline: qwen3_omni\nstages: {code2wav: {max_batch: 0}}\n",
     "stages.code2wav.max_batch: must be >= 1 and <= 1024, got 0"),
    ("pipeline: qwen3_omni\nstages: {talker: {max_batch: 99999999999999999999}}\n",
     "stages.talker.max_batch: must be >= 1 and <= 1024, got 99999999999999999999"),
    ("pipeline: qwen3_omni\nstages: {thinker: {instances: 100000000}}\n",
     "stages.thinker.instances: must be >= 1 and <= 64, got 100000000"),
    ("pipeline: qwen3_omni\nstages: {thinker: {engine: static, max_len: 0}}\n",
     "stages.thinker.max_len: must be >= 2 and <= 1048576, got 0"),
    ("pipeline: qwen3_omni\nstages: {code2wav: {chunk_frames: 0}}\n",
     "stages.code2wav.chunk_frames: must be >= 1 and <= 4096, got 0"),
    ("pipeline: qwen3_omni\nstages: {code2wav: {first_chunk_frames: 0}}\n",
     "stages.code2wav.first_chunk_frames: must be >= 1 and <= 4096, got 0"),
    ("pipeline: qwen3_omni\nstages: {thinker: {threads: 0}}\n",
     "stages.thinker.threads: must be >= 1 and <= 256, got 0"),
    ("pipeline: qwen3_omni\nstages: {thinker: {max_tokens: 0}}\n",
     "stages.thinker.max_tokens: must be >= 1 and <= 1048576, got 0"),
    # a static talker must hold every prompt the thinker takes (it ended longer ones at once: no speech, a 200)
    ("pipeline: qwen3_omni\nstages:\n  thinker: {engine: static, max_len: 128}\n"
     "  talker: {engine: static, max_len: 136}\n",
     "stages.talker.max_len: must be >= stages.thinker.max_len + 9 = 137 (a talker prompt is the thinker's prompt + 9 "
     "positions), got 136"),
    ("pipeline: qwen3_omni\nstages: {talker: {engine: static}}\n",
     "stages.talker.max_len: must be >= stages.thinker.max_len + 9 = 4105 (a talker prompt is the thinker's prompt + 9 "
     "positions), got 4096 (the default)"),
    # co-located: one process, one torch thread count
    ("pipeline: qwen3_omni\nlayout: colocated\nstages: {thinker: {threads: 2}, code2wav: {threads: 3}}\n",
     "stages.code2wav.threads: layout: colocated runs every stage in one process with one torch thread count, so "
     "every stage that gives threads needs the same value (stages.thinker.threads: 2, here 3)"),
])
def test_bad_deploy_files_name_the_key(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(deploy.DeployError) as info:
        deploy.load(path, environ={})
    assert message in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


LAUGHS = "pipeline: qwen3_omni\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi"))


def test_nested_aliases_are_refused_before_they_are_expanded(tmp_path):
    """The outside test's 10-line file: `_fill` walked 9^9 nodes (still running after 60 s at 1.7 GB)."""
    path = _write(tmp_path, LAUGHS)
    with pytest.raises(deploy.DeployError) as info:
        deploy.load(path, environ={})
    assert str(info.value) == f"{path}: a: YAML anchors and aliases are not allowed in a deploy file (&a on line 2)"


@pytest.mark.parametrize("stage, key", [(stage, key) for stage in deploy.PIPELINE_STAGES["qwen3_omni"]
                                        for key, kind in {**deploy.COMMON_KEYS, **deploy.STAGE_KEYS[stage]}.items()
                                        if kind == deploy.INT])
def test_every_integer_key_takes_its_range_and_nothing_outside(tmp_path, stage, key):
    low, high = deploy.RANGES[key]
    for value in (low, high):
        spec = deploy.load(_write(tmp_path, f"pipeline: qwen3_omni\nstages: {{{stage}: {{{key}: {value}}}}}\n"),
                           environ={}).stages[stage]
        assert {"instances": spec.instances, "max_batch": spec.max_batch}.get(key, spec.parameters.get(key)) in (
            value, str(value))
    for value in (low - 1, high + 1):
        path = _write(tmp_path, f"pipeline: qwen3_omni\nstages: {{{stage}: {{{key}: {value}}}}}\n")
        with pytest.raises(deploy.DeployError) as info:
            deploy.load(path, environ={})
        assert str(info.value) == f"{path}: stages.{stage}.{key}: must be >= {low} and <= {high}, got {value}"


def _parameters(config: Path) -> dict[str, str]:
    """The parameters of a rendered config.pbtxt as Triton parses them (protobuf text format)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    return {key: value.string_value for key, value in parsed.parameters.items()}


@pytest.mark.parametrize("value", ['/models/my "best" ckpt', 'a" } parameters { key: "x', "C:\\models\\q3",
                                   "two\nlines"])
def test_string_values_are_escaped_in_the_rendered_config(tmp_path, value):
    """A `"` broke the config.pbtxt (Triton refused the model after starting) or injected parameters; a `\\`
    was not escaped either. The parsed parameter equals the file's value, and nothing else is added."""
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    path = _write(tmp_path, f"pipeline: qwen3_omni\ncheckpoint: {quoted}\n")
    out = deploy.render(deploy.load(path, environ={}), tmp_path / "repo")
    for model in ("qwen3_omni_thinker", "qwen3_omni_talker", "qwen3_omni_code2wav"):
        parameters = _parameters(out / model / "config.pbtxt")
        template = _parameters(ROOT / "model_repository" / model / "config.pbtxt")
        assert parameters["checkpoint"] == value and set(parameters) <= set(template) | {"checkpoint"}


def test_colocated_threads_reach_every_stage(tmp_path):
    """`stages.thinker.threads: 2` was rendered as `thinker.threads`, which no stage reads (the process kept the
    template's `threads: 1`): now the one process's `threads`, which every engine's setup reads."""
    from omni_backends.qwen3_omni.serving import protocol

    path = _write(tmp_path, "pipeline: qwen3_omni\nlayout: colocated\nstages: {thinker: {threads: 2}, "
                            "talker: {threads: 2}}\n")
    parameters = _parameters(deploy.render(deploy.load(path, environ={}), tmp_path / "repo") / "qwen3_omni"
                             / "config.pbtxt")
    assert parameters["threads"] == "2" and not any(key.endswith(".threads") for key in parameters)
    assert [protocol.stage_parameters(parameters, stage)["threads"] for stage in ("thinker", "talker", "code2wav")] \
        == ["2", "2", "2"]


def _every_key():
    """Every key a deploy file has, dotted: the top-level ones, each stage, each stage's settings."""
    yield from sorted(deploy.TOP_KEYS)
    for stage in deploy.PIPELINE_STAGES["qwen3_omni"]:
        yield f"stages.{stage}"
        yield from (f"stages.{stage}.{key}" for key in sorted({*deploy.COMMON_KEYS, *deploy.STAGE_KEYS[stage]}))


@pytest.mark.parametrize("bad", ["[1, 2]", "{a: 1}"])
def test_a_list_or_mapping_anywhere_in_a_deploy_file_names_its_key(tmp_path, bad):
    """Every key, top-level and nested, given a list or a mapping: one DeployError line naming the file and
    that key (never a TypeError from deeper in, as `pipeline: [qwen3_omni]` was)."""
    for dotted in _every_key():
        if bad.startswith("{") and dotted.count(".") < 2 and dotted.startswith("stages"):
            continue   # a mapping is right for `stages` and a stage (their unknown key `a` is tested above)
        *parents, last = dotted.split(".")
        text = f"{last}: {bad}"
        for parent in reversed(parents):
            text = f"{parent}: {{{text}}}"
        path = _write(tmp_path, ("" if dotted == "pipeline" else "pipeline: qwen3_omni\n") + text + "\n")
        with pytest.raises(deploy.DeployError) as info:
            deploy.load(path, environ={})
        message = str(info.value)
        assert message.startswith(f"{path}: {dotted}: ") and "\n" not in message, (dotted, message)


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe pipeline: qwen3_omni\n", "cannot read the deploy file: not UTF-8 (byte 0xff at offset 0)"),
    (b"pipeline: qwen3_omni\ncheckpoint: caf\xe9\n", "cannot read the deploy file: not UTF-8 (byte 0xe9"),
    (None, "cannot read the deploy file: not a regular file"),
    ("fifo", "cannot read the deploy file: not a regular file"),   # open() would wait for a writer
    (b"#" * (1 << 20) + b"\n", f"cannot read the deploy file: larger than 1 MiB ({(1 << 20) + 1} bytes)"),
])
def test_unreadable_deploy_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "d.yaml"
    if content is None:
        path.mkdir()
    elif content == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    with pytest.raises(deploy.DeployError) as info:
        deploy.load(path, environ={})
    assert str(info.value) == f"{path}: {message}" or str(info.value).startswith(f"{path}: {message}")


def test_serve_reports_a_bad_deploy_file_in_one_line(tmp_path, capsys):
    from omni_frontend.serve import main

    path = _write(tmp_path, "pipeline: qwen3_omni\nstages: {thinker: {devise: cpu}}\n")
    assert main(["--deploy", str(path), "--no-prepare"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "stages.thinker.devise: unknown key" in err and len(err.splitlines()) == 1


def test_serve_refuses_a_missing_checkpoint_directory_before_starting(tmp_path, capsys, monkeypatch):
    """`checkpoint: /nonexistent/ckpt` started tritonserver and ended ~20 s later in ~20 lines (one traceback per
    model). A relative directory is taken under $OMNI_MODEL_HOME; presets are prepared by the launcher."""
    from omni_frontend import serve

    monkeypatch.setenv("OMNI_MODEL_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "mine").mkdir(parents=True)
    for checkpoint in ("mine", str(tmp_path / "home" / "mine"), "qwen3_omni_tiny", "qwen3_omni_30b_a3b_random"):
        serve.check_checkpoint(Path("f.yaml"), deploy.load(_write(tmp_path, f"pipeline: qwen3_omni\ncheckpoint: "
                                                                             f"{checkpoint}\n"), environ={}))
    path = _write(tmp_path, "pipeline: qwen3_omni\ncheckpoint: /nonexistent/ckpt\n")
    assert serve.main(["--deploy", str(path), "--log-dir", str(tmp_path / "log")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {path}: checkpoint: directory /nonexistent/ckpt does not exist (a relative one is taken "
                   "under $OMNI_MODEL_HOME; presets: qwen3_omni_tiny, qwen3_omni_30b_a3b_random)")
    with pytest.raises(ValueError, match=f"checkpoint: directory {tmp_path}/home/other does not exist"):
        serve.check_checkpoint(path, deploy.load(_write(tmp_path, "pipeline: qwen3_omni\ncheckpoint: other\n"),
                                                 environ={}))
    assert not (tmp_path / "log").exists() or not any((tmp_path / "log").iterdir())   # nothing started


def test_the_documented_render_only_command_runs_without_the_venv_on_path(tmp_path):
    """docs/gpu.md's render-only line (`python -m omni_frontend.deploy`) failed from a fresh shell (no module
    omni_frontend): it is now `./scripts/deploy`, which bootstraps .venv like scripts/serve."""
    line = next(line for line in (ROOT / "docs" / "gpu.md").read_text().splitlines() if "# render only" in line)
    assert line.split("#")[0].split() == ["./scripts/deploy", "deploy/qwen3_omni_h200.yaml"]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    done = subprocess.run(["./scripts/deploy", "deploy/qwen3_omni_cpu.yaml", "--out", str(tmp_path / "out")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(tmp_path / "out"), done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(deploy.load(
        ROOT / "deploy" / "qwen3_omni_cpu.yaml", environ={}).models)


def test_serve_refuses_a_gpu_deploy_file_on_a_machine_without_that_gpu(tmp_path, capsys):
    """deploy/qwen3_omni_h200.yaml on a machine without CUDA: tritonserver refused the model only after starting,
    in several lines ending "GPUs with at least the minimum required CUDA compute compatibility ... are: ". The
    launcher now counts the CUDA devices torch sees first: one line naming the stage and its device."""
    import torch

    from omni_frontend.serve import main

    if torch.cuda.device_count():
        pytest.skip("this machine has a CUDA device")
    path = ROOT / "deploy" / "qwen3_omni_h200.yaml"
    assert main(["--deploy", str(path), "--no-prepare", "--log-dir", str(tmp_path / "log")]) == 2
    err = capsys.readouterr().err.strip()
    stage = next(iter(deploy.load(path).stages))   # orchestrator in the file's default (co-located) layout
    assert err == (f"error: {path}: stages.{stage}.device: cuda:0, but this machine has no CUDA devices visible to "
                   f"torch (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                   "deploy/qwen3_omni_cpu.yaml places every stage on the CPU")
    assert not (tmp_path / "log").exists() or not any((tmp_path / "log").iterdir())   # nothing started


@pytest.mark.parametrize("content, message", [
    (b"pipeline: [qwen3_omni]\n", "pipeline: must be one of ['qwen3_omni'], got ['qwen3_omni']"),
    (b"pipeline: {a: 1}\n", "pipeline: must be one of ['qwen3_omni'], got {'a': 1}"),
    (b"\xff\xfe pipeline: qwen3_omni\n", "cannot read the deploy file: not UTF-8"),
])
def test_serve_reports_a_deploy_file_of_the_wrong_type_in_one_line(tmp_path, capsys, content, message):
    """The outside test's files: a traceback (TypeError: unhashable type) or a line naming neither the file nor
    the key, before."""
    from omni_frontend.serve import main

    path = tmp_path / "d.yaml"
    path.write_bytes(content)
    assert main(["--deploy", str(path), "--no-prepare", "--log-dir", str(tmp_path / "log")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: {message}") and len(err.splitlines()) == 1


def test_tts_engine_run_copy_sets_the_parameter_the_orchestrators_read(tmp_path):
    """`--tts-engine piper` serves a copy of the selected models whose voice_tts config names the engine; the
    `tts` orchestrator beside it reads the same parameter (omni_backends.voice.engines.stage_engine)."""
    from omni_backends.voice import engines
    from omni_frontend import serve
    from omni_frontend.tritonserver import LaunchError

    source = ROOT / "model_repository"
    out = serve.tts_engine_repository([source], ["voice_tts", "tts"], "piper", tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["tts", "voice_tts"]
    config = (out / "voice_tts" / "config.pbtxt").read_text()
    assert config.count('key: "engine"') == 1 and 'key: "engine" value { string_value: "piper" }' in config
    assert engines.stage_engine(out / "tts") == "piper" and engines.stage_engine(source / "tts") == "kokoro"
    with pytest.raises(LaunchError, match="voice_tts"):
        serve.tts_engine_repository([source], ["voice_asr"], "piper", tmp_path / "asr")
    assert serve.parse_args(["--tts-engine", "piper"]).tts_engine == "piper"
    with pytest.raises(SystemExit):
        serve.parse_args(["--tts-engine", "espeak"])


def test_prepare_skips_finished_tiny_checkpoints_without_importing_torch(tmp_path, monkeypatch):
    """Every launch runs `omni_backends.prepare` for its pipelines; with the tiny checkpoints already written it
    returns before importing torch / transformers / diffusers (~10 s each for qwen3_omni and qwen_image on
    2 cores)."""
    from omni_backends import prepare
    from omni_backends.paths import QWEN3_OMNI_TINY_VERSION

    for name, version in (("qwen3_omni_tiny", QWEN3_OMNI_TINY_VERSION), ("qwen_image_tiny", "ok\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".omni_tiny_complete").write_text(version)
    probe = ("import sys; from omni_backends import prepare; code = prepare.main(['qwen3_omni', 'qwen_image']); "
             "print(code, sorted(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))")
    env = {**os.environ, "OMNI_MODEL_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "[]"], done.stdout + done.stderr
    (tmp_path / "qwen3_omni_tiny" / ".omni_tiny_complete").write_text("ok\n")   # an older recipe's: rebuilt
    monkeypatch.setenv("OMNI_MODEL_HOME", str(tmp_path))
    assert not prepare._complete("qwen3_omni_tiny", QWEN3_OMNI_TINY_VERSION)
