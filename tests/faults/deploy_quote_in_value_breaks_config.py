"""Fault (outside test 16): a string value with a double quote is written into config.pbtxt unescaped.

What is wrong: `omni_frontend/deploy.py::set_parameters` writes `string_value: "{value}"` as is. A checkpoint
directory whose path holds a `"` (`checkpoint: '/models/my "best" ckpt'`), or any string value with one, renders a
config.pbtxt that does not parse (Triton refuses the model after starting) -- or, crafted, injects parameters
(`checkpoint: 'a" } parameters { key: "x'`). A backslash is not escaped either.
What is right: the value is escaped as protobuf text (`\\"`, `\\\\`), so the rendered config parses and the parameter
equals the file's value; or the loader refuses such a value in one line naming the key (exit 2).
Exits 1 while the rendered config does not carry the value back, 0 once fixed (no server needed; parses with
tritonclient's model_config_pb2).
"""
import pathlib
import subprocess
import sys
import tempfile

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
VALUES = ['/models/my "best" ckpt', 'a" } parameters { key: "x', "C:\\models\\q3"]
bad = []
for value in VALUES:
    with tempfile.TemporaryDirectory(prefix="brk16_") as tmp:
        path = pathlib.Path(tmp) / "q.yaml"
        path.write_text("pipeline: qwen3_omni\ncheckpoint: '" + value.replace("'", "''") + "'\n")
        done = subprocess.run([sys.executable, "-m", "omni_frontend.deploy", str(path), "--out", f"{tmp}/out"],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)
        if done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "checkpoint" in done.stderr:
            print(f"ok    {value!r} refused: {done.stderr.strip()}")
            continue
        config = model_config_pb2.ModelConfig()
        try:
            text_format.Parse((pathlib.Path(tmp) / "out/qwen3_omni_thinker/config.pbtxt").read_text(), config)
            got = config.parameters["checkpoint"].string_value
            extra = sorted(set(config.parameters) - {"checkpoint", "engine", "max_tokens", "threads", "dtype",
                                                     "kernels", "gpu_tensors", "max_len", "prefill_chunk",
                                                     "max_running", "cuda_graphs", "prefill_graph_tokens"})
            ok = got == value
            print(f"{'ok   ' if ok else 'FAULT'} {value!r} -> checkpoint parameter {got!r}")
        except (text_format.ParseError, OSError) as exc:
            ok = False
            print(f"FAULT {value!r} -> rendered config.pbtxt does not parse: {exc}")
        if not ok:
            bad.append(value)
print(f"FAULT present: {len(bad)} values not carried" if bad else "fixed")
sys.exit(1 if bad else 0)
