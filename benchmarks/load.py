"""The closed-loop HTTP load generator: ``concurrency`` workers, each sending its next request when the last
one is answered; every answer is verified, so a broken server posts no number."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

from benchmarks.results import Cell
from benchmarks.server import process_cpu


async def http_cell(url: str, model: str | None, texts: list[str], kind: str, batch: int, concurrency: int,
                    duration: float, dim: int | None, headers: dict, pid: int | None,
                    route: str = "/v1/embeddings", token_counts: dict[str, int] | None = None,
                    encoding: str = "base64", body_for: Callable[[list], dict] | None = None,
                    check: Callable[[int, bytes, int], bool] | None = None,
                    cpu: Callable[[int | None], float | None] = process_cpu) -> Cell:
    """One cell: ``batch`` texts per request to ``url + route`` for ``duration`` seconds (after one warm-up
    request per connection); the server's CPU is read from ``pid`` where given. aiohttp keeps the load
    generator cheap (it shares the CPU with the server on a small machine).

    Another task's request: ``body_for(chunk)`` is the JSON body for ``batch`` items of ``texts`` (any
    items: documents, image data URIs) and ``check(status, body, count)`` verifies its answer; by default
    an embeddings request, verified by ``verify``.

    ``cpu(pid)`` reads the server's CPU seconds at the window's start and end (default: the process alone;
    ``host_cpu.tree_cpu``: its whole process tree); the load generator's own CPU in the window (this
    process) goes to ``cell.client_cpu_seconds``."""
    import aiohttp

    cell = Cell(kind, batch, concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(base_url=url, connector=connector, timeout=timeout, headers=headers) as client:
        async def post(chunk):
            body = body_for(chunk) if body_for else {"input": chunk, "model": model, "encoding_format": encoding}
            async with client.post(route, json=body) as r:
                return r.status, await r.read()

        # warm-up: open every connection with a one-text request (a full-batch warm-up of many slow
        # requests would leave early connections idle past the server's keep-alive timeout)
        await asyncio.gather(*(post(texts[:1]) for _ in range(concurrency)))
        stop_at = time.perf_counter() + duration
        cpu0 = cpu(pid)
        client0 = time.process_time()
        start = time.perf_counter()

        async def worker(w: int):
            i = w * 7919
            while time.perf_counter() < stop_at:
                chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
                i += batch
                t = time.perf_counter()
                status, body = await post(chunk)
                elapsed = time.perf_counter() - t
                if not (check(status, body, len(chunk)) if check else verify(status, body, len(chunk), dim)):
                    cell.errors += 1
                    continue
                cell.latencies.append(elapsed)
                cell.items += len(chunk)
                cell.tokens += sum(token_counts[t] for t in chunk) if token_counts else 0

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        cell.seconds = time.perf_counter() - start
        cpu1 = cpu(pid)
        cell.client_cpu_seconds = time.process_time() - client0
        if cpu0 is not None and cpu1 is not None:
            cell.cpu_seconds = cpu1 - cpu0
    return cell


def verify(status: int, body: bytes, count: int, dim: int | None) -> bool:
    """A 200 with ``count`` embeddings in order, of the expected dimension, all finite (float lists or
    base64 little-endian float32, as the OpenAI SDK asks by default)."""
    import base64

    import numpy as np

    if status != 200:
        return False
    data = json.loads(body)["data"]
    if len(data) != count or [d["index"] for d in data] != list(range(count)):
        return False
    for d in data:
        emb = d["embedding"]
        vec = np.frombuffer(base64.b64decode(emb), dtype="<f4") if isinstance(emb, str) else np.asarray(emb)
        if (dim is not None and vec.shape != (dim,)) or not np.isfinite(vec).all():
            return False
    return True


# ---- one cell over a few client processes (so the load generator is not the limit) -----------------------

def warm_client(_: int) -> None:
    """Run once in each pool process: a spawned client imports its libraries before its first timed cell."""
    import aiohttp  # noqa: F401
    import numpy  # noqa: F401


def _client(url, model, texts, kind, batch, concurrency, duration, dim, pid, counts) -> Cell:
    return asyncio.run(http_cell(url, model, texts, kind, batch, concurrency, duration, dim, {}, pid,
                                 token_counts=counts))


def load_cell(pool: ProcessPoolExecutor | None, clients: int, url: str, texts: list[str], kind: str,
              batch: int, concurrency: int, duration: float, dim: int, pid: int, counts: dict,
              model: str = "bench") -> dict:
    """One closed-loop cell; ``concurrency`` workers split over up to ``clients`` processes of ``pool``
    (``Cell.combine``: counts and latencies summed, the rate over the mean window, server CPU read by
    the first). Returns the row, with the number of client processes."""
    procs = max(1, min(clients, concurrency))
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    if pool is None or procs == 1:
        parts = [_client(url, model, texts, kind, batch, concurrency, duration, dim, pid, counts)]
    else:
        futures = [pool.submit(_client, url, model, texts, kind, batch, share, duration, dim,
                               pid if i == 0 else None, counts) for i, share in enumerate(shares)]
        parts = [f.result() for f in futures]
    return {**Cell.combine(parts).row(), "client procs": procs}
