#!/usr/bin/env python
"""Host CPU of the executor path against the in-process engine, without HTTP: the near-free model of
scripts/bench_host_cpu.py (1 layer, hidden 32: what is left is the serving layer), ONNX Runtime's intra-op
spinning off, closed-loop callers of ``Engine.__call__`` — in this process's own engine, or in a
``remote_registry`` engine whose items run in one executor process (``ExecutorSet``, device ``cpu:0``).
Interleaved rounds; each cell is the CPU of the whole process tree (this process and the executor) per
embedding and per request, and the transport's cost is the difference per request.

    .venv/bin/python scripts/bench_executor.py --rounds 3 --seconds 4

Prints one line per round and cell, then the medians: µs of host CPU per embedding and per request,
embeddings/s, and the executor path's extra µs per request at 1 and 32 texts per request; plus the wall
time of one request alone (concurrency 1) both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.host_cpu import model_folder, tree_cpu  # noqa: E402
from benchmarks.texts import make_texts  # noqa: E402


def spec(folder: Path, device: str) -> dict:
    return {"path": str(folder), "name": "bench", "backend": "onnx", "dtype": "float32", "ort_spin": False,
            "device": device, "max_queue_items": 1_000_000}


async def closed_loop(engine, texts: list[str], batch: int, concurrency: int, seconds: float) -> tuple[int, int, float]:
    from core.tasks.embed import EmbedRequest

    stop = time.monotonic() + seconds
    done = [0]

    async def client(offset: int):
        i = offset
        while time.monotonic() < stop:
            chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
            await engine(EmbedRequest(texts=chunk))
            done[0] += 1
            i += batch

    cpu0, wall0 = tree_cpu(os.getpid()), time.monotonic()
    await asyncio.gather(*[client(c * 97) for c in range(concurrency)])
    return done[0], done[0] * batch, (tree_cpu(os.getpid()) - cpu0, time.monotonic() - wall0)


async def alone(engine, text: str, count: int) -> float:
    """Median wall µs of one one-text request with nothing else in flight."""
    from core.tasks.embed import EmbedRequest

    times = []
    for _ in range(count):
        started = time.perf_counter()
        await engine(EmbedRequest(texts=[text]))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per cell")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--batches", default="1,32", help="texts per request, comma-separated")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from core.config import ModelSpec, Settings
    from core.engine import Registry
    from core.executor import ExecutorSet, remote_registry
    from core.logs import configure_logging

    configure_logging("warning")
    folder = model_folder("near-free")
    texts = make_texts("short", 512)
    batches = [int(b) for b in args.batches.split(",")]
    local_settings = Settings(models=[ModelSpec(**spec(folder, "cpu"))], threads=1)
    remote_settings = Settings(models=[ModelSpec(**spec(folder, "cpu:0"))], threads=1)
    executors = ExecutorSet.start(remote_settings)
    rows: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    latency: dict[str, list[float]] = {"in-process": [], "executor": []}
    try:
        async def run():
            local = Registry.from_settings(local_settings)
            remote = remote_registry(remote_settings, executors.address)
            await local.start()
            await remote.start()
            ways = {"in-process": local.engines["bench"], "executor": remote.engines["bench"]}
            for way, engine in ways.items():  # warm both
                await closed_loop(engine, texts, 32, 8, 0.5)
            for round_ in range(1, args.rounds + 1):
                for batch in batches:
                    for way, engine in ways.items():
                        requests, embeddings, (cpu, wall) = await closed_loop(engine, texts, batch, args.concurrency,
                                                                              args.seconds)
                        cell = (cpu / embeddings * 1e6, cpu / requests * 1e6, embeddings / wall)
                        rows.setdefault((way, batch), []).append(cell)
                        print(f"round {round_} {way:10s} {batch:2d} texts: {cell[0]:7.1f} µs CPU/embedding  "
                              f"{cell[1]:7.1f} µs CPU/request  {cell[2]:9.0f} embeddings/s", flush=True)
                for way, engine in ways.items():
                    latency[way].append(await alone(engine, texts[0], 200))
            await remote.stop()
            await local.stop()

        asyncio.run(run())
    finally:
        executors.stop(timeout=10.0)
    print("\nmedians (host CPU of the whole process tree; concurrency %d)" % args.concurrency)
    print("| texts/request | way | µs CPU / embedding | µs CPU / request | embeddings/s |")
    print("|---|---|---|---|---|")
    med = {key: [statistics.median(v[i] for v in values) for i in range(3)] for key, values in rows.items()}
    for batch in batches:
        for way in ("in-process", "executor"):
            e, r, rate = med[(way, batch)]
            print(f"| {batch} | {way} | {e:.1f} | {r:.1f} | {rate:,.0f} |")
    for batch in batches:
        extra = med[("executor", batch)][1] - med[("in-process", batch)][1]
        print(f"transport: {extra:+.1f} µs host CPU per request of {batch} text(s)")
    print(f"one request alone (wall, median): in-process {statistics.median(latency['in-process']):.0f} µs, "
          f"executor {statistics.median(latency['executor']):.0f} µs")


if __name__ == "__main__":
    main()
