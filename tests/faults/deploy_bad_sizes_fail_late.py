"""Fault (outside test 16): sizes a stage cannot use pass the deploy loader and fail only inside tritonserver.

What is wrong: `omni_frontend/deploy.py` only checks ints are >= 0 (`instances` / `max_batch` >= 1), so
`stages.thinker.max_len: 0`, `stages.code2wav.chunk_frames: 0` / `first_chunk_frames: 0`, a `max_batch` past
int64 (`99999999999999999999`), `threads: 0` ("RuntimeError: set_num_threads expects a positive integer") and `instances: 100000000` are rendered. `./scripts/serve --deploy` then starts
tritonserver and fails 20-60 s later with several lines that name a config parameter, not the file's key
("error: creating server: ... ValueError: max_len must be >= 2, got 0", "... chunk sizes must be >= 1 frame, got
chunk_frames=0 ...", for the huge max_batch only "Internal - failed to load all models"), exit 1; and 10^8
instances would have Triton start 10^8 Python stub processes (not tried: it would take the machine down).
Worse, `stages.thinker.max_tokens: 0` (the request default) serves: /health 200, then every chat that sends no
max_tokens is a 500 "inference failed: ... qwen3_omni_thinker: max_tokens must be an integer >= 1, got 0".
docs/gpu.md ("Deploy files") and README promise a bad value is ONE line naming the file and the key, exit 2, before
anything starts.
What is right: each is refused by the loader, e.g. `error: f.yaml: stages.thinker.max_len: must be >= 2, got 0`.
Exits 1 while any is rendered, 0 once all are refused (no server needed).
"""
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = [
    ("thinker", "engine: static, max_len: 0", "stages.thinker.max_len"),
    ("talker", "engine: static, max_len: 1", "stages.talker.max_len"),
    ("code2wav", "chunk_frames: 0", "stages.code2wav.chunk_frames"),
    ("code2wav", "first_chunk_frames: 0", "stages.code2wav.first_chunk_frames"),
    ("talker", "max_batch: 99999999999999999999", "stages.talker.max_batch"),
    ("thinker", "instances: 100000000", "stages.thinker.instances"),
    ("thinker", "threads: 0", "stages.thinker.threads"),
    ("thinker", "max_tokens: 0", "stages.thinker.max_tokens"),
]
rendered = []
for stage, settings, key in CASES:
    with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
        path = pathlib.Path(tmp) / "bad.yaml"
        path.write_text(f"pipeline: qwen3_omni\nstages:\n  {stage}: {{{settings}}}\n")
        done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", str(path), "--out", f"{tmp}/out"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)
        err = done.stderr.strip()
        ok = done.returncode == 2 and len(err.splitlines()) == 1 and key in err
        print(f"{'ok   ' if ok else 'FAULT'} {stage}: {{{settings}}} -> rc={done.returncode} {err or done.stdout.strip()!r}")
        if not ok:
            rendered.append(key)
print(f"FAULT present: rendered {rendered}" if rendered else "fixed")
sys.exit(1 if rendered else 0)
