"""Fault (outside test 16): a deploy file naming a checkpoint directory that does not exist is found only by Triton.

What is wrong: `./scripts/serve --deploy f.yaml` with `checkpoint: /nonexistent/ckpt` renders, starts tritonserver,
and ~20 s later ends with exit 1 and ~20 lines: "error: tritonserver exited with code 1 during startup", Triton's own
"error: creating server: ... load failed for model 'qwen3_omni_thinker' ... FileNotFoundError: ... checkpoint
directory /nonexistent/ckpt does not exist" and one more such line per model. README: "A bad value is one
`error: ...` line naming the flag, file or key and a non-zero exit, before anything starts"; docs/gpu.md lists
`checkpoint` as a preset name or a directory. (A preset is prepared by the launcher; a directory is not looked at.)
What is right: the launcher checks a directory checkpoint (absolute, or under $OMNI_MODEL_HOME) before starting
anything: one line `error: f.yaml: checkpoint: directory /nonexistent/ckpt does not exist ...`, exit 2, in a second.
Exits 1 while the fault is present, 0 once fixed. Starts the launcher itself on PORT (default 43000) .. PORT+3:
run it with no other server on those ports.
"""
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
port = int(os.environ.get("PORT", "43000"))
with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
    path = pathlib.Path(tmp) / "nockpt.yaml"
    path.write_text("pipeline: qwen3_omni\ncheckpoint: /nonexistent/brk16/ckpt\n")
    started = time.monotonic()
    done = subprocess.run([str(ROOT / "scripts/serve"), "--deploy", str(path), "--port", str(port),
                           "--triton-grpc-port", str(port + 1), "--triton-metrics-port", str(port + 3),
                           "--log-dir", f"{tmp}/log"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    took = time.monotonic() - started
errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
started_triton = "starting tritonserver" in done.stderr
print(f"rc={done.returncode} in {took:.1f} s, tritonserver started: {started_triton}, error lines: {len(errors)}")
for line in errors[:3]:
    print("  ", line[:200])
ok = done.returncode == 2 and not started_triton and len(errors) == 1 and "checkpoint" in errors[0]
print("fixed" if ok else "FAULT present: the missing checkpoint directory is found only by tritonserver")
sys.exit(0 if ok else 1)
