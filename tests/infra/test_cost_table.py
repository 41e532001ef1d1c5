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
