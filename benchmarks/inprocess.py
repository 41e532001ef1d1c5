"""The served model called in-process: ``Engine.run_sync`` (tokenize + run + pool, no HTTP, no batcher), and
the bare backend call on pre-tokenized, pre-padded input, so a server's overhead is visible."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from benchmarks.texts import make_texts


def load_engine(path: Path, threads: int = 2, **spec):
    """One in-process Engine from a folder, through the same load path as the server."""
    from core.config import ModelSpec, Settings
    from core.engine import Engine

    model = ModelSpec(path=path, **spec)
    return Engine.load(model, Settings(models=[model], threads=threads))


def inprocess_cells(spec_kwargs: dict, kinds: list[str], batches: list[int], duration: float,
                    threads: int) -> list[dict]:
    """Rows per text kind × batch for the engine call and the bare runtime call, each timed for
    ``duration`` seconds after one warm-up call: embeddings/s, p50 latency, CPU ms per batch."""
    from core.tasks.embed import EmbedRequest

    engine = load_engine(threads=threads, **spec_kwargs)
    rows = []
    for kind in kinds:
        texts = make_texts(kind, 512)
        for batch in batches:
            chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
            for label, fn in (("engine (tokenize+run+pool)", None), ("bare runtime call", "bare")):
                if fn == "bare":
                    prepared = [engine.task.collate(engine.task.prepare(EmbedRequest(texts=c))) for c in chunks]

                    def call(j, prepared=prepared):
                        engine.backend.run(prepared[j % len(prepared)])
                else:
                    def call(j):
                        engine.run_sync(EmbedRequest(texts=chunks[j % len(chunks)]))
                call(0)
                lat = []
                cpu0 = time.process_time()
                start = time.perf_counter()
                j = 0
                while time.perf_counter() - start < duration:
                    t = time.perf_counter()
                    call(j)
                    lat.append(time.perf_counter() - t)
                    j += 1
                total = time.perf_counter() - start
                lat.sort()
                rows.append({"path": label, "texts": kind, "batch": batch,
                             "emb/s": j * batch / total, "p50 ms": statistics.median(lat) * 1000,
                             "cpu ms/batch": 1000 * (time.process_time() - cpu0) / j})
    return rows
