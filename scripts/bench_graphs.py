#!/usr/bin/env python
"""Which ONNX graph of one model runs fastest on this CPU: the bare ``InferenceSession.run`` of each graph
(default session options, ``--threads`` intra-op threads) on the same pre-tokenized, pre-padded batches,
the graphs **interleaved** (A B A B …) so the machine's drift hits them alike.

    python scripts/bench_graphs.py MODEL_DIR [--graph NAME=FILE]... [--texts short,long] [--batch 32]
        [--seconds 5] [--reps 6] [--threads 2]

Without ``--graph`` it compares the folder's own ``onnx/model.onnx`` (the plain export) with the same
graph fused offline by ONNX Runtime's transformer optimizer (``core.convert.fusion.fused_graph``,
written to a temporary file). Prints embeddings/s per graph and repetition, the median, and each graph's
ratio to the first with the min–max over repetitions; also checks that every graph's output matches the
first's (max |difference| of the pooled vectors), so a fast but wrong graph shows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.plain_ort import mean_pool, plain_feeds_maker, plain_session
from benchmarks.texts import make_texts


def timed(run, feeds: dict, batch: int, seconds: float) -> float:
    run(feeds)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run(feeds)
        done += 1
    return done * batch / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", type=Path)
    p.add_argument("--graph", action="append", default=[], metavar="NAME=FILE")
    p.add_argument("--texts", default="short,long")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    import numpy as np

    tmp = tempfile.TemporaryDirectory()
    graphs: dict[str, Path] = {}
    for item in args.graph:
        name, _, file = item.partition("=")
        if not file:
            p.error(f"--graph wants NAME=FILE, not {item!r}")
        graphs[name] = Path(file)
    if not graphs:
        import onnx

        from core.convert.fusion import fused_graph

        plain = args.model_dir / "onnx" / "model.onnx"
        config = json.loads((args.model_dir / "config.json").read_text())
        fused = fused_graph(plain, config)
        if fused is None:
            raise SystemExit(f"no transformer fusions for model_type {config.get('model_type')!r}")
        onnx.save(fused, f"{tmp.name}/fused.onnx")
        graphs = {"plain": plain, "fused": Path(tmp.name) / "fused.onnx"}

    runs = {name: plain_session(path, args.threads) for name, path in graphs.items()}
    feeds_for = plain_feeds_maker(args.model_dir / "tokenizer.json")
    first = next(iter(graphs))
    for kind in args.texts.split(","):
        feeds = feeds_for(make_texts(kind, args.batch))
        ref = mean_pool(runs[first](feeds), feeds["attention_mask"])
        for name, run in runs.items():
            diff = float(np.abs(mean_pool(run(feeds), feeds["attention_mask"]) - ref).max())
            print(f"{kind}: {name} max |diff| vs {first}: {diff:.2e}", flush=True)
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for rep in range(args.reps):
            for name, run in runs.items():
                rates[name].append(timed(run, feeds, args.batch, args.seconds))
            print(f"{kind} rep {rep + 1}: " + "  ".join(f"{n} {r[-1]:.0f}" for n, r in rates.items()), flush=True)
        tokens = int(feeds["input_ids"].shape[1])
        print(f"\n| {kind} (padded to {tokens} tokens), batch {args.batch} | emb/s median | ratio to {first} (min–max) |")
        print("|---|---|---|")
        for name, r in rates.items():
            ratios = [a / b for a, b in zip(r, rates[first])]
            print(f"| {name} | {statistics.median(r):.0f} | {statistics.median(ratios):.2f} "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) |")
        print(flush=True)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
