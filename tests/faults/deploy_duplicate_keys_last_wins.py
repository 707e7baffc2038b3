"""Fault (outside test 16): a deploy file with a key given twice is taken silently, the last value winning.

What is wrong: `omni_frontend/deploy.py::load` uses `yaml.safe_load`, which keeps the last of duplicated mapping
keys. A file that names `checkpoint:` twice, or a stage twice (an edited copy of `deploy/qwen3_omni_cpu.yaml` with
`thinker: {device: cpu}` and, further down, `thinker: {device: cuda:0, ...}`), renders without a word: the earlier
settings vanish (here `stages.thinker` rendered `KIND_GPU gpus: [ 0 ]`, the `cpu` line dropped).
What is right: as for an unknown key, one line naming the file and the key, exit 2, e.g.
`error: f.yaml: stages.thinker: given twice (lines 3 and 4)`.
Exits 1 while a duplicate is accepted, 0 once refused (no server needed).
"""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = [
    ("pipeline: qwen3_omni\ncheckpoint: qwen3_omni_tiny\ncheckpoint: /elsewhere/ckpt\n", "checkpoint"),
    ("pipeline: qwen3_omni\nstages:\n  thinker: {device: cpu}\n  thinker: {device: cpu, threads: 2}\n", "stages.thinker"),
    ("pipeline: qwen3_omni\nstages:\n  thinker: {threads: 1, threads: 2}\n", "stages.thinker.threads"),
]
accepted = []
for text, key in CASES:
    with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
        path = pathlib.Path(tmp) / "dup.yaml"
        path.write_text(text)
        done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", str(path), "--out", f"{tmp}/out"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)
        err = done.stderr.strip()
        ok = done.returncode == 2 and len(err.splitlines()) == 1 and key in err
        print(f"{'ok   ' if ok else 'FAULT'} duplicate {key} -> rc={done.returncode} {err or done.stdout.strip()!r}")
        if not ok:
            accepted.append(key)
print(f"FAULT present: duplicates accepted {accepted}" if accepted else "fixed")
sys.exit(1 if accepted else 0)
