#!/usr/bin/env bash
# perf_analyzer against a running Omni-Triton tritonserver (gRPC streaming), one client-facing model.
#
# Usage: perf_analyzer_configs/run.sh MODEL [options] [-- extra perf_analyzer args]
#   MODEL              a client-facing Triton model with an input file here: voice, qwen3_omni, tts,
#                      voice_asr, qwen_image, mock_stream (framework test model)
#   --url HOST:PORT    Triton gRPC address (default 127.0.0.1:8001)
#   --concurrency R    perf_analyzer --concurrency-range START:END:STEP (default 1:4:1)
#   --export FILE      --profile-export-file (default var/perf_analyzer/MODEL.json): every request's send
#                      time and each response's arrival time (decoupled models send many)
#   --input FILE       --input-data (default perf_analyzer_configs/MODEL.json)
# Defaults after `--` can be overridden there, e.g. `-- --measurement-interval 10000`.
#
# The binary: $PERF_ANALYZER if set, else perf_analyzer on PATH (NGC SDK container), else the one in the
# tritonclient==2.41.0 wheel, fetched once with `pip download` into ~/.cache/omni-triton/perf_analyzer/
# (the registry has no perf_analyzer wheel for this platform; newer tritonclient wheels no longer carry
# it). That binary needs libb64.so.0d and libcudart.so.12: they are symlinked under those sonames from
# the nvidia-pytriton wheel's nvidia_pytriton.libs/ (hashed names) into the cache's lib/ folder.
#
# NGC SDK container equivalent (same flags; perf_analyzer is on PATH there):
#   docker run --rm --net host -v "$PWD/perf_analyzer_configs:/cfg" nvcr.io/nvidia/tritonserver:24.10-py3-sdk \
#     perf_analyzer -m voice -i grpc --streaming -u 127.0.0.1:8001 --input-data /cfg/voice.json \
#     --concurrency-range 1:4:1 --profile-export-file /cfg/voice.export.json
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${OMNI_VENV:-$ROOT/.venv}/bin/python
CACHE=${OMNI_PA_CACHE:-$HOME/.cache/omni-triton/perf_analyzer}
VERSION=2.41.0

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
MODEL=$1; shift
URL=127.0.0.1:8001; RANGE=1:4:1; EXPORT=$ROOT/var/perf_analyzer/$MODEL.json; INPUT=$ROOT/perf_analyzer_configs/$MODEL.json
while [ $# -gt 0 ]; do
  case $1 in
    --url) URL=$2; shift 2 ;;
    --concurrency) RANGE=$2; shift 2 ;;
    --export) EXPORT=$2; shift 2 ;;
    --input) INPUT=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ -f "$INPUT" ] || { echo "run.sh: no input data $INPUT (models with one: $(cd "$ROOT/perf_analyzer_configs" && ls *.json | sed 's/\.json$//' | tr '\n' ' '))" >&2; exit 2; }

# Prints the path of a runnable perf_analyzer, fetching and wiring the wheel's binary when needed.
locate() {
  if [ -n "${PERF_ANALYZER:-}" ]; then echo "$PERF_ANALYZER"; return; fi
  if command -v perf_analyzer >/dev/null 2>&1; then command -v perf_analyzer; return; fi
  local bin=$CACHE/tritonclient-$VERSION.data/data/bin/perf_analyzer
  if [ ! -x "$bin" ]; then
    echo "[run.sh] fetching tritonclient==$VERSION (perf_analyzer) into $CACHE" >&2
    mkdir -p "$CACHE"
    "$PYTHON" -m pip download -q --no-deps --disable-pip-version-check "tritonclient==$VERSION" -d "$CACHE" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
    "$PYTHON" - "$CACHE" "$VERSION" <<'PY'
import glob, sys, zipfile
cache, version = sys.argv[1:]
member = f"tritonclient-{version}.data/data/bin/perf_analyzer"
with zipfile.ZipFile(glob.glob(f"{cache}/tritonclient-{version}-*.whl")[0]) as wheel:
    wheel.extract(member, cache)
PY
    chmod +x "$bin"
  fi
  local libs
  libs=$("$PYTHON" -c 'import os, pytriton; print(os.path.join(os.path.dirname(os.path.dirname(pytriton.__file__)), "nvidia_pytriton.libs"))')
  mkdir -p "$CACHE/lib"
  ln -sf "$(ls "$libs"/libb64-*.so.0d | head -1)" "$CACHE/lib/libb64.so.0d"
  ln -sf "$(ls "$libs"/libcudart-*.so.12* | head -1)" "$CACHE/lib/libcudart.so.12"
  echo "$bin"
}

PA=$(locate)
mkdir -p "$(dirname "$EXPORT")"
export LD_LIBRARY_PATH=$CACHE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set -x
exec "$PA" -m "$MODEL" -i grpc --streaming -u "$URL" --input-data "$INPUT" --concurrency-range "$RANGE" \
  --measurement-interval 5000 --profile-export-file "$EXPORT" "$@"
