"""Fault (outside test 16): a deploy file's `max_batch: 0` passes the loader's `>= 1` check and serves a broken talker.

What is wrong: `omni_frontend/deploy.py::_stage` checks `spec.max_batch or 1` against `>= 1`, so `max_batch: 0`
is taken for "unset" by the check but rendered as `max_batch_size: 0` into the talker's / code2wav's config.pbtxt.
`./scripts/serve --deploy` with `stages: {talker: {max_batch: 0}}` starts (about a minute), /health is 200, and then
every chat with audio is a 500 "inference failed: qwen3_omni: StageError: qwen3_omni_talker: ... unexpected shape
for input 'TALKER_PARAMS'" (seen on the stage layout, tiny checkpoint, CPU).
What is right: like `instances: 0`, the file is refused before anything starts, one line naming the key, exit 2:
`error: <file>: stages.talker.max_batch: must be >= 1, got 0`.
Exits 1 while the fault is present, 0 once fixed (no server needed: renders with `python -m omni_frontend.deploy`).
"""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
failed = []
for stage in ("talker", "code2wav"):
    with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
        path = pathlib.Path(tmp) / "mb0.yaml"
        path.write_text(f"pipeline: qwen3_omni\nstages:\n  {stage}: {{max_batch: 0}}\n")
        done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", str(path), "--out", f"{tmp}/out"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)
        err = done.stderr.strip()
        ok = done.returncode == 2 and len(err.splitlines()) == 1 and f"stages.{stage}.max_batch" in err
        print(f"{stage}.max_batch: 0 -> rc={done.returncode} {err or done.stdout.strip()!r}")
        if not ok:
            failed.append(stage)
print("FAULT present: max_batch 0 is rendered" if failed else "fixed")
sys.exit(1 if failed else 0)
