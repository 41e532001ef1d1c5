"""Front-end processes of the executor tests (spawned): each builds its own remote registry and sends
requests, checking every answer against the reference of its own inputs."""

from __future__ import annotations

import asyncio
import os
import random

import numpy as np

from core.errors import Overloaded
from tests.executor.conftest import rss_kib


def load_client(settings, address: str, texts: list[str], references: dict, seed: int, requests: int,
                concurrency: int) -> dict:
    """``requests`` mixed requests (embeddings of 1–16 texts, per-token vectors, reranking; one in ten cancelled
    soon after it is sent), ``concurrency`` at a time. Counts: ok, crossed (an answer that is not its own
    input's), overloaded (429), cancelled, other errors, and the requests each executor received."""
    from core.executor import remote_registry
    from core.tasks.embed import EmbedRequest
    from core.tasks.rerank import RerankRequest

    rng = random.Random(seed)
    counts = {"ok": 0, "crossed": 0, "overloaded": 0, "cancelled": 0, "errors": [], "lost": 0}

    async def one(registry, slots):
        kind = rng.choice(["embed", "embed", "embed", "tokens", "rerank"])
        picks = [rng.randrange(len(texts)) for _ in range(rng.randint(1, 16))]
        cancel = rng.random() < 0.1
        async with slots:
            if kind == "rerank":
                work = registry.engines["rr"](RerankRequest(query=references["query"],
                                                            documents=[texts[i] for i in picks]))
            else:
                work = registry.engines["emb"](EmbedRequest(texts=[texts[i] for i in picks],
                                                            output="tokens" if kind == "tokens" else "pooled"))
            task = asyncio.ensure_future(work)
            if cancel:
                await asyncio.sleep(rng.random() * 0.005)
                task.cancel()
            try:
                result = await task
            except asyncio.CancelledError:
                counts["cancelled"] += 1
                return
            except Overloaded:
                counts["overloaded"] += 1
                return
            except Exception as exc:  # counted, and the test fails on it
                counts["errors"].append(f"{type(exc).__name__}: {exc}")
                return
        if kind == "rerank":
            good = np.allclose(result.scores, references["scores"][picks], atol=1e-4)
        elif kind == "tokens":
            good = all(v.shape == references["tokens"][i].shape and np.allclose(v, references["tokens"][i], atol=1e-4)
                       for v, i in zip(result.vectors, picks))
        else:
            good = np.allclose(result.vectors, references["vectors"][picks], atol=1e-4)
        counts["ok" if good else "crossed"] += 1

    async def main():
        registry = remote_registry(settings, address)
        await registry.start()
        slots = asyncio.Semaphore(concurrency)
        tasks = [asyncio.ensure_future(one(registry, slots)) for _ in range(requests)]
        done, pending = await asyncio.wait(tasks, timeout=180)
        counts["lost"] = len(pending)
        sent = {link.device: dict(link.sent) for engine in registry.engines.values() for link in engine.links}
        await registry.stop()
        return sent

    counts["sent"] = asyncio.run(main())
    return counts


def connect_and_wait(settings, address: str, ready) -> None:
    """Connect to every executor, say so, and wait to be killed (a front end that dies without closing)."""
    from core.executor import remote_registry

    async def main():
        registry = remote_registry(settings, address)
        await registry.start()
        ready.set()
        await asyncio.sleep(600)

    asyncio.run(main())


def front_end_memory(settings, address: str | None, model: str) -> dict:
    """RSS growth of a fresh process that serves ``model`` as a front end (``address``: executors) or
    in-process (None), from after the imports both need to after one answered request; and whether a
    runtime that holds weights (onnxruntime, torch) was imported."""
    import sys

    from core.engine import Registry
    from core.executor import remote_registry
    from core.tasks.embed import EmbedRequest

    before = rss_kib(os.getpid())

    async def serve():
        registry = remote_registry(settings, address) if address else Registry.from_settings(settings)
        await registry.start()
        result = await registry.engines[model](EmbedRequest(texts=["how much memory does this take"]))
        after = rss_kib(os.getpid())
        await registry.stop()
        return result.vectors.shape, after

    shape, after = asyncio.run(serve())
    return {"growth_kib": after - before, "shape": shape,
            "runtimes": sorted(m for m in ("onnxruntime", "torch") if m in sys.modules)}
