#!/usr/bin/env python
"""Soak: N minutes of mixed traffic against a server on loopback, printing the server's RSS over time.

    python scripts/soak.py --minutes 10 [--concurrency 16] [--interval 15]

Traffic: short/long/mixed texts, 1–32 per request, float and base64, Matryoshka dimensions, int8
outputs, and a share of bad requests (400/404/413/422) — every answer is checked. Ends by itself,
prints RSS samples and growth (first sample after warm-up → last), and exits non-zero on any 5xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from benchmarks.artifacts import ensure_onnx
from benchmarks.server import rss_mb, start_server, stop_server, wait_ready
from benchmarks.texts import make_texts


def request_mix(rng: random.Random, pools: dict[str, list[str]]) -> tuple[dict, set[int]]:
    """A request body and the statuses it may get."""
    roll = rng.random()
    if roll < 0.05:
        return {"input": [], "model": "soak"}, {400}
    if roll < 0.08:
        return {"input": "x", "model": "missing"}, {404}
    if roll < 0.10:
        return {"input": 5, "model": "soak"}, {422}
    kind = rng.choice(list(pools))
    n = rng.choice([1, 1, 4, 32])
    body = {"input": rng.sample(pools[kind], n), "model": "soak",
            "encoding_format": rng.choice(["float", "base64"])}
    if rng.random() < 0.2:
        body["dimensions"] = rng.choice([64, 128, 256])
    if rng.random() < 0.1:
        body["embedding_type"] = rng.choice(["int8", "ubinary"])
    return body, {200, 429}


async def run(url: str, minutes: float, concurrency: int, interval: float, pid: int) -> int:
    import aiohttp

    pools = {k: make_texts(k, 512) for k in ("short", "long", "mixed")}
    stop_at = time.monotonic() + minutes * 60
    counts: dict[int, int] = {}
    unexpected = 0
    samples: list[tuple[float, float]] = []
    start = time.monotonic()

    async with aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def worker(seed: int):
            nonlocal unexpected
            rng = random.Random(seed)
            while time.monotonic() < stop_at:
                body, allowed = request_mix(rng, pools)
                async with session.post("/v1/embeddings", json=body) as r:
                    await r.read()
                    counts[r.status] = counts.get(r.status, 0) + 1
                    if r.status not in allowed:
                        unexpected += 1

        async def sampler():
            while time.monotonic() < stop_at:
                samples.append((time.monotonic() - start, rss_mb(pid)))
                print(f"t={samples[-1][0]:6.0f}s rss={samples[-1][1]:7.1f} MB answers={sum(counts.values())}",
                      flush=True)
                await asyncio.sleep(interval)

        await asyncio.gather(sampler(), *(worker(i) for i in range(concurrency)))
    samples.append((time.monotonic() - start, rss_mb(pid)))
    base = samples[min(1, len(samples) - 1)][1]
    print(json.dumps({"answers_by_status": counts, "unexpected": unexpected,
                      "rss_first_mb": round(base, 1), "rss_last_mb": round(samples[-1][1], 1),
                      "rss_growth_mb": round(samples[-1][1] - base, 1)}))
    return 1 if unexpected or any(s >= 500 for s in counts) else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--interval", type=float, default=15)
    p.add_argument("--port", type=int, default=8766)
    args = p.parse_args()
    from core.config import default_model_path

    folder = ensure_onnx(default_model_path())
    proc = start_server([{"path": str(folder), "name": "soak", "backend": "onnx"}], args.port, None, {})
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, proc)
        return asyncio.run(run(url, args.minutes, args.concurrency, args.interval, proc.pid))
    finally:
        stop_server(proc)


if __name__ == "__main__":
    raise SystemExit(main())
