#!/usr/bin/env python
"""The embedding cache's hit against its miss, for one request of ``--texts`` short texts (default 32),
over HTTP to a real server (``uvicorn core.dev:app`` on loopback) with ``embedding_cache`` = ``memory``
and, with ``--redis URL`` (or ``--redis-server``: a ``redis-server`` started on a free loopback port for the
run), a Redis cache.

    python scripts/bench_cache.py [--model DIR] [--texts 32] [--rounds 30] [--threads 2] [--redis-server]

Each round sends a request of texts never sent before (a miss: the model runs), then the same request
again (a hit); the two answers are checked to be byte-identical. Prints the median and p90 of each, and
the median of the per-round ratio miss/hit. Also times the same pair in-process (``AsyncModels``, no
HTTP), where only the cache's own cost remains. Default model: the embedded all-MiniLM-L6-v2, exported to
ONNX once into .venv/models/.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.artifacts import ensure_onnx
from benchmarks.loopback import free_port
from benchmarks.server import start_server, stop_server, wait_ready
from benchmarks.texts import make_texts


def summary(name: str, miss: list[float], hit: list[float]) -> dict:
    ratios = sorted(m / h for m, h in zip(miss, hit))
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    row = {"cell": name, "miss_p50_ms": round(statistics.median(miss) * 1e3, 2),
           "miss_p90_ms": round(q(miss, 0.9) * 1e3, 2), "hit_p50_ms": round(statistics.median(hit) * 1e3, 3),
           "hit_p90_ms": round(q(hit, 0.9) * 1e3, 3), "miss/hit p50 of rounds": round(statistics.median(ratios), 1),
           "miss/hit min": round(ratios[0], 1)}
    print(json.dumps(row), flush=True)
    return row


def over_http(model: Path, cache: str, n: int, rounds: int, threads: int) -> dict:
    import httpx

    port = free_port()
    proc = start_server([{"path": str(model), "name": "m", "backend": "onnx"}], port, threads,
                        {"TESSERA_EMBEDDING_CACHE": cache, "TESSERA_ACCESS_LOG": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        miss, hit = [], []
        with httpx.Client(timeout=60) as client:
            for r in range(-3, rounds):  # three warm-up rounds
                body = {"input": make_texts("short", n, seed=f"{cache}-{r}-{time.time_ns()}"),
                        "encoding_format": "base64"}
                times, answers = [], []
                for _ in range(2):
                    start = time.perf_counter()
                    response = client.post(url + "/v1/embeddings", json=body)
                    times.append(time.perf_counter() - start)
                    response.raise_for_status()
                    answers.append([base64.b64decode(d["embedding"]) for d in response.json()["data"]])
                if answers[0] != answers[1]:
                    raise SystemExit("the hit's answer differs from the miss's")
                if r >= 0:
                    miss.append(times[0])
                    hit.append(times[1])
        return summary(f"http {cache.split('://')[0]}", miss, hit)
    finally:
        stop_server(proc)


def in_process(model: Path, n: int, rounds: int, threads: int) -> dict:
    from core.config import Settings
    from core.inprocess import AsyncModels

    settings = Settings(models=[{"path": str(model), "name": "m", "backend": "onnx"}], threads=threads,
                        embedding_cache="memory")

    async def run() -> dict:
        miss, hit = [], []
        async with AsyncModels(settings) as engine:
            for r in range(-3, rounds):
                texts = make_texts("short", n, seed=f"inproc-{r}-{time.time_ns()}")
                times, answers = [], []
                for _ in range(2):
                    start = time.perf_counter()
                    answers.append(await engine.embed(texts))
                    times.append(time.perf_counter() - start)
                if answers[0].tobytes() != answers[1].tobytes():
                    raise SystemExit("the hit's answer differs from the miss's")
                if r >= 0:
                    miss.append(times[0])
                    hit.append(times[1])
        return summary("in-process memory", miss, hit)

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="model folder (default: the embedded MiniLM)")
    p.add_argument("--texts", type=int, default=32)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--redis", default=None, help="a redis:// URL to measure too")
    p.add_argument("--redis-server", action="store_true", help="start a redis-server on loopback for the run")
    args = p.parse_args(argv)
    from core.config import default_model_path

    model = ensure_onnx(args.model or default_model_path())
    rows = [in_process(model, args.texts, args.rounds, args.threads),
            over_http(model, "memory", args.texts, args.rounds, args.threads)]
    server = None
    if args.redis_server:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.support.redis_server import RedisServer

        server = RedisServer().start()
        args.redis = server.url
    try:
        if args.redis:
            rows.append(over_http(model, args.redis, args.texts, args.rounds, args.threads))
    finally:
        if server is not None:
            server.stop()
    print("| cell | miss p50 ms | hit p50 ms | miss/hit (median of rounds) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['cell']} | {row['miss_p50_ms']} | {row['hit_p50_ms']} | {row['miss/hit p50 of rounds']}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
