"""scripts/cost_table.py: the formula on a known input (the figures themselves come from the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.server import ROOT


def test_cost_per_million_follows_the_formula(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"texts": "short", "batch": 32, "tessera emb/s": 1000.0}]}))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"platforms": [
        {"name": "inst", "kind": "instance", "usd_per_hour": 3.6, "source": "s", "emb_scale": 2.0},
        {"name": "fn", "kind": "lambda", "memory_gb": 2.0, "usd_per_gb_s": 0.00001, "usd_per_million_requests": 0.2,
         "source": "s"},
        {"name": "gpu", "kind": "instance", "usd_per_hour": 1.0, "gpu": True, "source": "s"}]}))
    out = subprocess.run([sys.executable, "scripts/cost_table.py", "--bench", str(bench), "--prices", str(prices)],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines()[2:]}
    assert rows["inst"] == f"{3.6 / 3600 * 1e6 / 2000:.4f}"  # $0.5 per million at 2000 emb/s
    assert rows["fn"] == f"{1e6 / 1000 * 2.0 * 0.00001 + 1e6 / 32 * 0.2 / 1e6:.4f}"
    assert rows["gpu"] == "not measured"


def test_gpu_rows_read_the_saturated_cells_of_a_gpu_benchmark(tmp_path):
    """A scripts/bench_gpu.py JSON: the default configuration's cells at the largest batch and most clients;
    a GPU platform without an emb_scale (nothing relates the measured GPU to it) stays unmeasured."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"texts": "short", "batch": 32, "tessera emb/s": 1000.0}]}))
    cell = {"errors": 0}
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"backends": {
        "onnx:float16@cuda": {"status": "not run"},
        "auto (defaults)": {"http": [
            {**cell, "texts": "short", "batch": 1, "conc": 64, "emb/s": 900.0},
            {**cell, "texts": "short", "batch": 32, "conc": 1, "emb/s": 3000.0},
            {**cell, "texts": "short", "batch": 32, "conc": 64, "emb/s": 7200.0}]}}}))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"platforms": [
        {"name": "same gpu", "kind": "instance", "usd_per_hour": 3.6, "gpu": True, "source": "s", "emb_scale": 1.0},
        {"name": "other gpu", "kind": "instance", "usd_per_hour": 1.0, "gpu": True, "source": "s"}]}))
    out = subprocess.run([sys.executable, "scripts/cost_table.py", "--bench", str(bench), "--prices", str(prices),
                          "--gpu-bench", str(gpu)], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in out.splitlines()[2:]}
    assert rows["same gpu"] == f"{3.6 / 3600 * 1e6 / 7200:.4f}"
    assert rows["other gpu"] == "not measured"
