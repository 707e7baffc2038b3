"""Fault (outside test 16): in the co-located layout a stage's `threads` is rendered prefixed and has no effect.

What is wrong: docs/gpu.md ("Deploy files") says that with `layout: colocated` "`checkpoint`, `kernels`,
`threads`, `default_voice` stay unprefixed". `omni_frontend/deploy.py::_colocate` keeps only checkpoint / kernels
unprefixed (`SHARED_PARAMETERS`), so `stages.thinker.threads: 2` becomes `thinker.threads: "2"` beside the template's
`threads: "1"`. The co-located model then calls `stage_checkpoint` -> `torch.set_num_threads` once per stage in one
process (thinker, talker, code2wav in turn), each overriding the last, so the process keeps code2wav's value (here
the shared 1; read from the code, not measured): a thinker's `threads: 2` (e.g. on a 2-core CPU deploy) is silently
dropped. Nothing says so.
What is right: as documented -- `threads` of the one process is one unprefixed parameter (given on any stage, or
refused naming the key when stages disagree), or per-stage threads really apply; never silently dropped.
Exits 1 while `stages.thinker.threads: 2` (colocated) renders no unprefixed `threads` of 2 and is not refused;
0 once fixed (no server needed).
"""
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
    path = pathlib.Path(tmp) / "col.yaml"
    path.write_text("pipeline: qwen3_omni\nlayout: colocated\nstages:\n  thinker: {threads: 2}\n")
    done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", str(path), "--out", f"{tmp}/out"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    if done.returncode == 2 and "threads" in done.stderr:
        print("refused:", done.stderr.strip())
        sys.exit(0)
    config = (pathlib.Path(tmp) / "out/qwen3_omni/config.pbtxt").read_text()
threads = re.findall(r'parameters \{ key: "([a-z0-9.]*threads)" value \{ string_value: "([^"]*)" \} \}', config)
print("rendered:", threads)
ok = ("threads", "2") in threads
print("fixed" if ok else "FAULT present: the thinker's threads: 2 is rendered as thinker.threads, which sets nothing")
sys.exit(0 if ok else 1)
