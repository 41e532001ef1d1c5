#!/usr/bin/env python
"""What handing a request's preparation (tokenization) to a thread costs the process, beside the work itself:
64 closed-loop callers on one event loop each hand a small piece of Python work (about 5 µs) to two threads,
through a ``concurrent.futures`` pool (``loop.run_in_executor``: a wake-up of a worker per request and of the
event loop per result), through ``core.preparing.Preparers`` (a worker takes every request queued while it was
busy and hands their results back in one wake-up), and on the event loop itself (no hand-over: the floor).

    .venv/bin/python scripts/bench_handover.py
    .venv/bin/python scripts/bench_handover.py --calls 40000 --repeats 5

Prints, per repeat and way, the process's CPU µs per call (every thread) and the calls per second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def work(value: int) -> int:
    """About 5 µs of Python (a short text's preparation is ~10-20 µs, most of it outside the interpreter)."""
    total = 0
    for i in range(200):
        total += i
    return total + value


async def measure(way: str, calls: int, callers: int) -> tuple[float, float]:
    from core.preparing import Preparers

    loop = asyncio.get_running_loop()
    pool = preparers = None
    if way == "pool":
        pool = ThreadPoolExecutor(2)

        def hand(value: int):
            return loop.run_in_executor(pool, work, value)
    elif way == "preparers":
        preparers = Preparers(work, workers=2, name="bench")
        hand = preparers
    else:
        async def hand(value: int):
            return work(value)

    async def caller(n: int) -> None:
        for i in range(n):
            await hand(i)

    await asyncio.gather(*(caller(50) for _ in range(callers)))  # warm: threads started
    per_caller = max(1, calls // callers)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(per_caller) for _ in range(callers)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if pool is not None:
        pool.shutdown()
    if preparers is not None:
        preparers.shutdown()
    n = per_caller * callers
    return cpu / n * 1e6, n / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=20000, help="calls per measurement")
    p.add_argument("--callers", type=int, default=64, help="closed-loop callers")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the three ways")
    args = p.parse_args(argv)
    print(f"{args.callers} callers, {args.calls} calls each way, {args.repeats} interleaved repeats")
    for repeat in range(1, args.repeats + 1):
        for way in ("pool", "preparers", "inline"):
            us, rate = asyncio.run(measure(way, args.calls, args.callers))
            print(f"repeat {repeat} {way:9s} {us:6.1f} µs CPU per call  {rate:8.0f} calls/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
