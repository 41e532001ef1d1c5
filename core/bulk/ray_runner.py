"""``python -m core embed --on ray``: the same job on Ray Data.

The driver lists the parts still to do (row ranges of ``rows_per_part``, after those a killed run left) as a
dataset of part descriptors; ``map_batches`` hands each part to an actor of a pool (``concurrency``: one
model copy per actor, ``num_gpus=1`` each where the cluster has GPUs). An actor reads its rows from the
input itself (so the input must be reachable from every node: a shared path or ``s3://``), embeds them
through its own engine and store (repeats computed once per actor; once for the whole cluster with a Redis
``embedding_cache``), and returns ids and vectors. The driver receives the parts in order and writes them
into the work folder as ``--on local`` does: resume, the exactly-once ids, the merge and the metadata are
the local job's. A local Ray is started for the job unless ``RAY_ADDRESS`` names a cluster."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from core.bulk import formats
from core.bulk.job import JobOptions, Summary, begin, finish, record_model, text_limit, write_part
from core.errors import require


class EmbedActor:
    """One model copy: a ``map_batches`` callable class (constructed once per actor)."""

    def __init__(self, settings, options: JobOptions) -> None:
        from core.bulk.job import ChunkEmbedder
        from core.cache import build_cache
        from core.cache.stores import MemoryStore

        ray = require("ray", "ray")
        settings = actor_settings(settings, ray.get_gpu_ids())
        shared = build_cache(settings)
        store = shared.store if shared is not None else MemoryStore(settings.embedding_cache_bytes)
        self.options = options
        self.loop = asyncio.new_event_loop()
        self.embedder = self.loop.run_until_complete(ChunkEmbedder(settings, options, store=store).start())

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        out: dict[str, list] = {"start": [], "ids": [], "vectors": [], "computed": [], "repeated": [], "model": []}
        for start, end in zip(batch["start"], batch["end"]):
            chunk = next(formats.read_chunks(self.options.input, fmt=self.options.format,
                                             text_column=self.options.text_column, id_column=self.options.id_column,
                                             rows=int(end) - int(start), skip=int(start),
                                             limit=text_limit(self.embedder.settings, self.options)))
            before = (self.embedder.cache.misses, self.embedder.cache.hits)
            vectors = self.loop.run_until_complete(self.embedder.embed(chunk.texts, chunk.where))
            out["start"].append(int(start))
            out["ids"].append(list(chunk.ids))
            out["vectors"].append(np.asarray(vectors))
            out["computed"].append(self.embedder.cache.misses - before[0])
            out["repeated"].append(self.embedder.cache.hits - before[1])
            out["model"].append(self.embedder.model_metadata())
        return {k: _column(v) for k, v in out.items()}


def actor_settings(settings, gpu_ids: list):
    """An actor's settings: given GPUs by Ray (``ray.get_gpu_ids()``), its models run on CUDA."""
    if not gpu_ids:
        return settings
    return settings.model_copy(update={"models": [m.model_copy(update={"device": "cuda"})
                                                  for m in settings.model_specs()]})


def actor_request(resources: dict, threads: int, actors: int | None, parts: int) -> dict:
    """``map_batches``' actor pool for a cluster of ``resources`` (``ray.cluster_resources()``): with GPUs,
    one actor per GPU (``num_gpus=1`` each, never more actors than GPUs, which Ray would wait for forever);
    without, one per ``threads`` CPUs, each asking for its threads. Never more actors than parts."""
    gpus = int(resources.get("GPU", 0))
    cpus = int(resources.get("CPU", 1))
    if actors is None:
        actors = gpus or max(1, cpus // max(1, threads))
    if gpus:
        actors = min(actors, gpus)
    actors = max(1, min(actors, parts))
    return {"concurrency": actors, "num_gpus": 1 if gpus else 0, "num_cpus": 0 if gpus else min(threads, cpus)}


def _column(values: list) -> Any:
    import numpy as np

    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def part_ranges(options: JobOptions, resume: int, limit: formats.TextLimit | None = None) -> list[tuple[int, int]]:
    """The row ranges still to do: the input's rows counted (one pass, which refuses a text over ``limit``
    before any actor starts; Parquet: its footer)."""
    total = formats.input_rows(options.input)
    if total is None:
        total = 0
        for chunk in formats.read_chunks(options.input, fmt=options.format, text_column=options.text_column,
                                         id_column=options.id_column, rows=options.rows_per_part, limit=limit):
            total = chunk.start + len(chunk.texts)
    step = options.rows_per_part
    return [(start, min(start + step, total)) for start in range(resume, total, step)]


def start_ray(num_cpus: int | None = None):
    """Connect to ``RAY_ADDRESS`` when set, else start a local Ray for the job. Returns (ray, started here)."""
    ray = require("ray", "ray")
    if ray.is_initialized():
        return ray, False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray, True


def run_ray(settings, options: JobOptions, *, actors: int | None = None, num_cpus: int | None = None) -> Summary:
    started = time.monotonic()
    summary = Summary(output=options.output)
    state = begin(settings, options, summary)
    if state is None:
        return summary
    try:
        if not state.complete:
            ranges = part_ranges(options, state.resume, text_limit(settings, options))
            if ranges:
                _embed_on_ray(settings, options, state.work, ranges, summary, actors, num_cpus)
        return finish(state, options, summary, started)
    finally:
        state.folder.release()


def _embed_on_ray(settings, options, work, ranges, summary, actors, num_cpus) -> None:
    ray, started_here = start_ray(num_cpus)
    try:
        request = actor_request(ray.cluster_resources(), settings.threads, actors, len(ranges))
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # parts come back in row order
        dataset = ray.data.from_items([{"start": s, "end": e} for s, e in ranges])
        results = dataset.map_batches(
            EmbedActor, fn_constructor_args=(settings, options), batch_size=1, **request)
        id_name = options.id_column or "id"
        recorded = False
        for row in results.iter_rows():
            if not recorded:
                record_model(work, row["model"])
                recorded = True
            metadata = {"model": row["model"], "options": options.vector_options()}
            write_part(work, int(row["start"]), list(row["ids"]), row["vectors"], metadata, id_name)
            summary.rows_this_run += len(row["ids"])
            summary.computed += int(row["computed"])
            summary.repeated += int(row["repeated"])
    finally:
        if started_here:
            ray.shutdown()
