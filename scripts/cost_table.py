#!/usr/bin/env python3
"""What a million embeddings cost per platform, from measured throughput and list prices.

    .venv/bin/python scripts/cost_table.py --bench docs/bench/compare-int8-sat-default.json \\
        --prices docs/bench/prices.json [--gpu-bench GPU.json]

Formula, per platform and text length:
- an instance billed by the hour (SageMaker, Modal): ``usd_per_hour / 3600 × 1e6 / emb_per_s``;
- Lambda (billed per GB-second of the invocation, plus per request): ``1e6 / emb_per_s × memory_gb ×
  usd_per_gb_s + 1e6 / batch × usd_per_million_requests / 1e6``.

``emb_per_s`` is the Tessera throughput in the benchmark JSON (rows with ``texts`` and ``tessera emb/s``,
as scripts/compare_infinity.sh writes them; measured on the benchmark machine) times the platform's
``emb_scale`` (an assumption: its compute relative to that machine, e.g. 0.5 for one vCPU against two
cores). GPU platforms need a GPU measurement (``--gpu-bench``: a ``scripts/bench_gpu.py`` JSON, whose
saturated cells of the default configuration are read), and an ``emb_scale`` that relates the measured GPU
to theirs; without both their rows say so. Every output row says which of its inputs are measured and
which assumed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def gpu_rows(data: dict) -> list[dict]:
    """The saturated cells (largest batch, most clients) of a ``scripts/bench_gpu.py`` JSON's default
    configuration (``auto (defaults)``, else its first backend with HTTP cells), as compare-style rows."""
    entries = data["backends"]
    entry = entries.get("auto (defaults)") or next((e for e in entries.values() if e.get("http")), None)
    if not entry or not entry.get("http"):
        raise SystemExit("GPU benchmark JSON: no backend with HTTP cells")
    cells = entry["http"]
    batch = max(c["batch"] for c in cells)
    conc = max(c["conc"] for c in cells if c["batch"] == batch)
    return [{"texts": c["texts"], "batch": batch, "tessera emb/s": c["emb/s"]}
            for c in cells if c["batch"] == batch and c["conc"] == conc]


def throughput(path: Path) -> tuple[dict[str, float], int]:
    """emb/s per text kind, and the batch (texts per request) they were measured with."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "backends" in data:
        data = gpu_rows(data)
    rows = data["rows"] if isinstance(data, dict) else data
    found = {row["texts"]: float(row["tessera emb/s"]) for row in rows if "tessera emb/s" in row}
    batches = {int(row.get("batch", 1)) for row in rows}
    if not found:
        raise SystemExit(f"{path}: no rows with 'texts' and 'tessera emb/s'")
    return found, max(batches)


def cost_per_million(platform: dict, emb_per_s: float, batch: int) -> float:
    seconds = 1e6 / emb_per_s
    if platform["kind"] == "lambda":
        requests = 1e6 / batch
        return seconds * platform["memory_gb"] * platform["usd_per_gb_s"] + requests * platform[
            "usd_per_million_requests"] / 1e6
    return platform["usd_per_hour"] / 3600 * seconds


def table(prices: dict, cpu: tuple[dict[str, float], int], gpu: tuple[dict[str, float], int] | None) -> str:
    kinds = sorted(cpu[0])
    lines = [f"| platform | {' | '.join(f'$ / 1M ({k})' for k in kinds)} | inputs |",
             "|---|" + "---|" * len(kinds) + "---|"]
    for platform in prices["platforms"]:
        source = gpu if platform.get("gpu") else cpu
        if platform.get("gpu") and "emb_scale" not in platform:
            source = None  # no assumption relates the measured GPU to this one: a run on it is needed
        if source is None:
            cells = ["not measured" for _ in kinds]
            note = "needs a GPU throughput run on this GPU (scripts/bench_gpu.py) for --gpu-bench"
        else:
            measured, batch = source
            scale = platform.get("emb_scale", 1.0)
            cells = [f"{cost_per_million(platform, measured[k] * scale, batch):.4f}" if k in measured else "—"
                     for k in kinds]
            note = (f"throughput measured ({', '.join(f'{k} {measured[k]:.0f} emb/s' for k in kinds if k in measured)}"
                    f", batch {batch}); scale ×{scale:g} assumed"
                    + (f" ({platform['scale_note']})" if platform.get("scale_note") else "")
                    + f"; price: {platform['source']}")
        lines.append(f"| {platform['name']} | {' | '.join(cells)} | {note} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, required=True, help="CPU benchmark JSON (compare_infinity output)")
    parser.add_argument("--prices", type=Path, default=Path(__file__).resolve().parents[1] / "docs/bench/prices.json")
    parser.add_argument("--gpu-bench", type=Path, default=None, help="GPU benchmark JSON of the same shape")
    args = parser.parse_args(argv)
    prices = json.loads(args.prices.read_text())
    gpu = throughput(args.gpu_bench) if args.gpu_bench else None
    print(table(prices, throughput(args.bench), gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
