#!/usr/bin/env python
"""What the inference thread spends around the model call for one text batch: ``pad_batch`` (the token
arrays the backend takes) and mean pooling of the hidden states under the attention mask (what
``EmbedTask.postprocess`` does with every batch, on every backend: torch's hidden states come back to the
host too). On a GPU server this host work sits between two model calls, so it bounds the GPU's share.

    .venv/bin/python scripts/bench_pooling.py
    # the commit before a change, measured in the same run
    git worktree add --detach /tmp/before HEAD~1
    .venv/bin/python scripts/bench_pooling.py --baseline /tmp/before

Prints, per batch shape (items × hidden size, short texts of 8–19 tokens) and checkout, the best of 5
repeats of µs per batch for each step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: (items per batch, hidden size): the near-free model's size, then all-MiniLM-L6-v2's at CPU and GPU batch sizes
SHAPES = ((32, 32), (512, 32), (32, 384), (256, 384), (1024, 384))


def measure() -> list[dict]:
    """In the child: this checkout's (``sys.path[0]``) ``pad_batch`` and ``pool``, timed per shape."""
    import timeit

    import numpy as np

    from core.tasks.vectors import pool
    from core.tokenization import Encoded, pad_batch

    rng = np.random.default_rng(0)
    rows = []
    for n, dim in SHAPES:
        items = []
        for length in rng.integers(8, 20, n):
            ids = rng.integers(0, 30000, length).astype(np.int64)
            items.append(Encoded(ids, np.zeros_like(ids)))
        width = pad_batch(items, 0)["input_ids"].shape[1]
        hidden = rng.standard_normal((n, width, dim)).astype(np.float32)
        lengths = np.fromiter((item.cost for item in items), dtype=np.int64, count=n)
        mask = np.arange(width)[None, :] < lengths[:, None]  # as the embedding task builds it
        number = max(20, 4000 // n)

        def best(fn) -> float:
            return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

        rows.append({"items": n, "dim": dim, "pad_batch us": best(lambda: pad_batch(items, 0)),
                     "mean pooling us": best(lambda: pool(hidden, mask, "mean"))})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, help="another checkout of Tessera, measured in the same run")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return 0
    sides = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    results = {}
    for name, root in sides.items():
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child"], check=True,
                             capture_output=True, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
        results[name] = json.loads(out.stdout)
    print("| items × hidden | " + " | ".join(f"{name}: pad_batch µs | {name}: mean pooling µs" for name in results)
          + " |")
    print("|---|" + "---|---|" * len(results))
    for i, (n, dim) in enumerate(SHAPES):
        cells = " | ".join(f"{r[i]['pad_batch us']:.0f} | {r[i]['mean pooling us']:.0f}" for r in results.values())
        print(f"| {n} × {dim} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
