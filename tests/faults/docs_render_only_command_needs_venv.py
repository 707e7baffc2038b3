"""Fault (outside test 16, docs): docs/gpu.md's "render only" command does not run as written from a fresh shell.

What is wrong: docs/gpu.md gives, beside `./scripts/serve --deploy ...` (which bootstraps and uses `.venv` itself),
  python -m omni_frontend.deploy deploy/qwen3_omni_h200.yaml          # render only (prints the folder)
(also the module docstring of omni_frontend/deploy.py). In a new user's shell `python` is not the project's venv:
"Error while finding module specification for 'omni_frontend.deploy' (ModuleNotFoundError: No module named
'omni_frontend')". Nothing in README / docs/gpu.md says to activate `.venv` first.
What is right: the documented line works from the checkout's root as written (e.g. `.venv/bin/python -m ...`, or a
`scripts/` wrapper that bootstraps like `scripts/serve` / `scripts/bench`), or the docs say to activate `.venv`.
Exits 1 while the line, run as written with a PATH without .venv, fails; 0 once it works or the docs say so.
"""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
text = (ROOT / "docs/gpu.md").read_text()
if re.search(r"(source|\.) \.venv/bin/activate|activate (the )?`?\.venv", text):
    print("docs/gpu.md says to activate .venv: fixed")
    sys.exit(0)
line = next((l for l in text.splitlines() if "render only" in l and l.strip().startswith(("python", ".venv", "scripts",
                                                                                          "./"))), None)
if line is None:
    print("no render-only command line in docs/gpu.md any more: fixed (or moved; check by hand)")
    sys.exit(0)
command = line.split("#")[0].strip()
path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if ".venv" not in p)
env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")} | {"PATH": path}
done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
print(f"$ {command}\nrc={done.returncode} {(done.stderr or done.stdout).strip()[-200:]}")
sys.exit(0 if done.returncode == 0 else 1)
