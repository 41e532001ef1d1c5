"""Build one in-process Engine from a folder (the same load path as the server): ``benchmarks.inprocess``
holds it (the benchmarks load engines the same way); and run requests through its batcher at once."""

from __future__ import annotations

import asyncio

from benchmarks.inprocess import load_engine

__all__ = ["load_engine", "run_concurrently"]


def run_concurrently(engine, requests) -> list:
    """``requests`` submitted together through ``engine``'s batcher (started for them, then stopped), so
    they share padded batches; their results, in order."""

    async def main():
        await engine.start()
        try:
            return await asyncio.gather(*(engine(r) for r in requests))
        finally:
            await engine.stop()

    return asyncio.run(main())
