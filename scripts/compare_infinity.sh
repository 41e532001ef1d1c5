#!/usr/bin/env bash
# Tessera vs Infinity on this machine: installs infinity-emb 0.0.78 ([server] + its optimum/ONNX engine)
# in its own virtualenv (.venv/infinity), plus Pillow and aiohttp (its image input, for --task clip), then runs
# scripts/compare_infinity.py (arguments pass through).
#   scripts/compare_infinity.sh --precision fp32 --duration 10 --reps 2
#   scripts/compare_infinity.sh --task rerank --precision int8 --duration 6 --reps 2
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap"
inf="$root/.venv/infinity"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$inf/bin/infinity_emb" ]; then
  "$PY" -m venv "$inf"
  "$inf/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  "$inf/bin/python" -m pip install -q --disable-pip-version-check "infinity-emb[server,optimum]==0.0.78"
fi
# Infinity's CLIP (torch engine) decodes images with Pillow and reads data URIs with aiohttp (the [vision]
# extra's other packages are for timm and ColPali models)
"$inf/bin/python" -c "import PIL, aiohttp" 2>/dev/null \
  || "$inf/bin/python" -m pip install -q --disable-pip-version-check pillow aiohttp
# the chart and the load generator's needs, in the project environment
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check "matplotlib>=3.8" "aiohttp>=3.9"
cd "$root"
exec "$root/.venv/bin/python" scripts/compare_infinity.py --infinity "$inf/bin/infinity_emb" "$@"
