#!/usr/bin/env python
"""Start-up of the SageMaker container's server, measured as SageMaker sees it.

    python scripts/coldstart_sagemaker.py [--runs 3] [--model-dir DIR]

Each run starts ``adapters/sagemaker/serve`` (what ``docker run IMAGE serve`` runs) in a fresh process on a
loopback port, with ``SM_MODEL_DIR`` set to DIR (default: no folder, so the embedded default model), and
polls ``GET /ping`` every 20 ms until it answers 200. Printed per run: seconds from the process start to
the port accepting connections, and to the first ``/ping`` 200; then the median. The environment is the
image's (offline Hugging Face, no tokenizers parallelism), the caller's variables winning. The container's
own start and the instance provisioning are not included (only AWS can measure those). Configure models
with TESSERA_* as for the container (e.g. TESSERA_MODELS). With ``backend: auto`` (the default) a folder of
torch weights is served through ONNX Runtime from the export cache: fill it first with
``python -m core prepare --model DIR``, as an image build would, or the first run includes the export.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.loopback import free_port

ROOT = Path(__file__).resolve().parents[1]
#: what the SageMaker images set (adapters/sagemaker/Dockerfile.*), unless the caller's environment sets it
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def one_run(model_dir: str, timeout_s: float) -> tuple[float, float]:
    port = free_port()
    env = {**IMAGE_ENV, **os.environ, "SAGEMAKER_BIND_TO_PORT": str(port), "TESSERA_HOST": "127.0.0.1",
           "SM_MODEL_DIR": model_dir}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "adapters/sagemaker/serve"), "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    opened = None
    try:
        while time.perf_counter() - started < timeout_s:
            if proc.poll() is not None:
                raise SystemExit(f"serve exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                    if response.status == 200:
                        return opened or time.perf_counter() - started, time.perf_counter() - started
            except urllib.error.HTTPError:
                opened = opened or time.perf_counter() - started  # the port answers, not ready yet
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.02)
        raise SystemExit(f"no /ping 200 within {timeout_s}s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model-dir", default="/nonexistent-sm-model-dir",
                        help="SM_MODEL_DIR (default: none, so TESSERA_MODELS or the embedded default model)")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    pings = []
    for i in range(args.runs):
        opened, ready = one_run(args.model_dir, args.timeout)
        pings.append(ready)
        print(f"run {i + 1}: port open {opened:.2f}s, /ping 200 {ready:.2f}s", flush=True)
    print(f"median /ping 200: {statistics.median(pings):.2f}s over {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
