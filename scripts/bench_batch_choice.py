#!/usr/bin/env python
"""What choosing a batch costs the batcher: ``Batcher._take`` (walk the queue's head, pick by length around the
oldest item, keep the rest queued) on the queue a closed loop of 64 clients keeps full, per case: texts per
request (1 or 32, each 12–14 tokens: the benchmarks' short texts), and the batch limits of a CPU (512 padded
tokens, 64 items) or an accelerator (16,384 tokens; 64 or 256 items). It runs on the event loop once per batch,
so at 32 texts a request its cost per item is part of every embedding's host CPU.

    .venv/bin/python scripts/bench_batch_choice.py
    # beside another checkout's batcher (its core/batching.py), interleaved in this process
    git worktree add --detach /tmp/before HEAD~1
    .venv/bin/python scripts/bench_batch_choice.py --baseline /tmp/before

Prints, per case, the median over ``--repeats`` of µs a batch and µs an item chosen (only the ``_take`` call
is timed; each repeat starts from the same full queue).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: (texts per request, max_batch_tokens, max_batch_size)
CASES = [(1, 512, 64), (32, 512, 64), (1, 16384, 64), (32, 16384, 64), (32, 16384, 256)]
CLIENTS = 64


def batching_of(checkout: Path, name: str) -> ModuleType:
    """``checkout``'s ``core/batching.py`` loaded as module ``name`` (its own imports are this checkout's)."""
    spec = importlib.util.spec_from_file_location(name, checkout / "core" / "batching.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def take_cost(batching: ModuleType, loop: asyncio.AbstractEventLoop, texts: int, budget: int, size: int,
              repeats: int) -> tuple[float, int]:
    """(median µs a ``_take`` call, items it chose) on a full queue: ``CLIENTS`` requests of ``texts`` items."""
    batcher = batching.Batcher(lambda items: items, max_batch_tokens=budget, max_batch_size=size,
                               max_queue_items=10**6)
    rng = random.Random(0)  # the same queue for every checkout and round
    requests, queue = [], []
    for _ in range(CLIENTS):
        request = batching._Request(loop.create_future(), [None] * texts, texts, None, 0.0, queued=texts)
        requests.append(request)
        queue.extend(batching._Slot(request, i, None, rng.randint(12, 14)) for i in range(texts))
    times, chosen = [], 0
    for _ in range(repeats):
        for request in requests:
            request.queued = texts
        batcher._queue = list(queue)
        started = time.perf_counter()
        chosen = len(batcher._take())
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6, chosen


def measure(checkouts: dict[str, Path], repeats: int, rounds: int) -> list[dict]:
    """One row per case: per checkout, the median over ``rounds`` interleaved rounds of µs a batch."""
    modules = {label: batching_of(path, f"_bench_batching_{i}") for i, (label, path) in enumerate(checkouts.items())}

    async def run() -> list[dict]:
        loop = asyncio.get_running_loop()
        rows = []
        for texts, budget, size in CASES:
            per_round: dict[str, list[float]] = {label: [] for label in modules}
            items: dict[str, int] = {}
            for _ in range(rounds):
                for label, module in modules.items():
                    us, items[label] = take_cost(module, loop, texts, budget, size, repeats)
                    per_round[label].append(us)
            row = {"texts": texts, "budget": budget, "size": size}
            for label in modules:
                row[label] = {"us_per_batch": statistics.median(per_round[label]), "items": items[label]}
            rows.append(row)
        return rows

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout whose core/batching.py runs beside this one")
    parser.add_argument("--repeats", type=int, default=300, help="_take calls a round (default 300)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args(argv)
    checkouts = {"this": ROOT}
    if args.baseline is not None:
        if not (args.baseline / "core" / "batching.py").is_file():
            parser.error(f"{args.baseline} has no core/batching.py")
        checkouts["baseline"] = args.baseline
    rows = measure(checkouts, args.repeats, args.rounds)
    print(f"Batcher._take on a full queue of {CLIENTS} requests, 12–14 tokens an item; median of {args.rounds} rounds "
          f"of the median of {args.repeats} calls")
    head = "| texts a request | batch limits (tokens, items) | items chosen | µs a batch | µs an item |"
    rule = "|---|---|---|---|---|"
    if "baseline" in checkouts:
        head += " baseline µs a batch | this ÷ baseline |"
        rule += "---|---|"
    print(head)
    print(rule)
    for row in rows:
        this = row["this"]
        line = (f"| {row['texts']} | {row['budget']}, {row['size']} | {this['items']} | {this['us_per_batch']:.1f} | "
                f"{this['us_per_batch'] / this['items']:.2f} |")
        if "baseline" in row:
            base = row["baseline"]
            line += f" {base['us_per_batch']:.1f} | {this['us_per_batch'] / base['us_per_batch']:.2f} |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
