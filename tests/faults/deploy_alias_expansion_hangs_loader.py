"""Fault (outside test 16): a deploy file of nested YAML aliases ("billion laughs") hangs the loader.

What is wrong: `omni_frontend/deploy.py::load` fills `${VAR}` placeholders (`_fill`) over the whole parsed file
BEFORE checking its keys; `_fill` walks aliases as copies, so nine levels of `[*x, *x, ...]` (a 10-line file whose
first unknown key is on line 2) make it visit 9^9 nodes: `python -m omni_frontend.deploy` (and
`./scripts/serve --deploy`) was still running after 60 s at 1.7 GB of memory and growing. A self-referencing alias
is already refused in one line ("a value refers to itself"); a shared one is not.
What is right: one line naming the file and the key within a second, exit 2 (here `a: unknown key (known: ...)`:
check the keys first and fill only known string values, or refuse aliases / bound the nodes visited).
Exits 1 while the loader runs past 20 s or answers otherwise, 0 once fixed (no server needed).
"""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
lines = ["pipeline: qwen3_omni", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
for prev, name in zip("abcdefgh", "bcdefghi"):
    lines.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
    path = pathlib.Path(tmp) / "laughs.yaml"
    path.write_text("\n".join(lines) + "\n")
    try:
        done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", str(path), "--out", f"{tmp}/out"],
                              capture_output=True, text=True, cwd=ROOT, timeout=20)
    except subprocess.TimeoutExpired:
        print("FAULT present: the loader still runs after 20 s")
        sys.exit(1)
err = done.stderr.strip()
print(f"rc={done.returncode} {err[:200]!r}")
ok = done.returncode == 2 and len(err.splitlines()) == 1
print("fixed" if ok else "FAULT present")
sys.exit(0 if ok else 1)
