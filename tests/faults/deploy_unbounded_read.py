"""Fault (outside test 16): the deploy loader reads any file whole, so a wrong path eats memory and ends in a traceback.

What is wrong: `omni_frontend/deploy.py::load` does `yaml.safe_load(path.read_text())` with no bound: `--deploy
/dev/zero` (or a FIFO, or a multi-GB checkpoint file named by mistake) reads until memory runs out. Under a 3 GB
address-space limit `python -m omni_frontend.deploy /dev/zero` ends in a MemoryError traceback (no `error:` line);
without a limit it grows until the machine's memory is gone.
What is right: a deploy file is small; read at most a bound (say 1 MiB) and a regular file only: one line
`error: /dev/zero: cannot read the deploy file: not a regular file` (or "larger than 1 MiB"), exit 2, at once.
Exits 1 while the fault is present, 0 once fixed (no server needed; the child runs under `ulimit -v` 3 GB, 20 s).
"""
import pathlib
import resource
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


try:
    done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", "/dev/zero", "--out", "/tmp/brk16_zero_out"],
                          capture_output=True, text=True, cwd=ROOT, timeout=20, preexec_fn=limit)
except subprocess.TimeoutExpired:
    print("FAULT present: still reading after 20 s")
    sys.exit(1)
err = done.stderr.strip()
print(f"rc={done.returncode} last line: {err.splitlines()[-1][:200] if err else ''!r}")
ok = done.returncode == 2 and len(err.splitlines()) == 1 and err.startswith("error:")
print("fixed" if ok else "FAULT present")
sys.exit(0 if ok else 1)
