#!/usr/bin/env bash
# The GPU benchmark in one command, on a GPU machine without network (docs/gpu-bench.md):
#
#   bash scripts/bench_gpu.sh                 # in the repository root, with .whl/ from scripts/fetch_gpu_wheels.sh
#
# Installs the wheels of .whl/ into /tmp/site, prints nvidia-smi and the torch/CUDA versions, then runs
# scripts/bench_gpu.py (torch fp16 on CUDA; ONNX Runtime CUDA fp16 when onnxruntime-gpu is there), which
# stops starting cells at its deadline (400 s after it starts) and writes $OUT/gpu-bench.json and
# $OUT/benchmarks-gpu.md after every phase; the whole log goes to $OUT/log.txt.
# Arguments are passed on to bench_gpu.py (e.g. --duration 2 --backends torch).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.bench/gpu}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}

main() {
t0=$(date +%s)

if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "error: no .whl/*.whl here: run scripts/fetch_gpu_wheels.sh on a machine with PyPI and copy .whl/ here"
    return 2
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: installing the wheels of .whl/ failed"; return 3; }
# the wheels, then this checkout (core/ and benchmarks/ are not installed here)
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
echo "[install] $(( $(date +%s) - t0 )) s"

nvidia-smi || echo "(no nvidia-smi)"
"$PY" - <<'EOF'
import sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| available", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
try:
    import onnxruntime
    print("onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
except ImportError:
    print("onnxruntime: not installed")
EOF
echo "[versions] $(( $(date +%s) - t0 )) s"

# bench_gpu.py stops at its own deadline; this outer limit only guards against a hang
timeout -k 10 450 "$PY" scripts/bench_gpu.py --out "$OUT" "$@"
rc=$?
echo "[total] $(( $(date +%s) - t0 )) s, bench_gpu.py exit $rc"
ls -la "$OUT"
return $rc
}

main "$@" 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
