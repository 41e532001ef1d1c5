"""``python -m core embed --on modal`` and ``modal run adapters/modal/app.py::bulk``: the job on the Modal
class (adapters/modal/app.py). This process reads the input (a local path or ``s3://``), keeps the job's
work folder, store and parts exactly as ``--on local`` does (resume, exactly-once ids, repeats embedded
once, the merge), and sends only the texts never seen to the class's ``embed_shard``, ``.map`` over shards
of ``shard_size`` texts for ``window`` parts at a time, so the containers autoscale over many shards. The
model's identity comes from the class (``describe_model``), hashed where the model is served."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from core.bulk import formats
from core.bulk.job import JobError, JobOptions, Summary, begin, finish, record_model, text_limit, write_part
from core.bulk.workfolder import refuse_crossed_paths

#: embed_shard's options: what changes a vector (the job's, as /v1/embeddings' keywords)
SHARD_OPTIONS = ("dimensions", "normalize", "prompt", "prompt_name", "truncate", "chunking", "embedding_type")


def shard_options(options: JobOptions) -> dict:
    values = options.vector_options()
    return {k: values[k] for k in SHARD_OPTIONS if values.get(k) is not None}


async def describe_engine(settings, registry, model: str | None) -> dict:
    """What a bulk job's output records of the served model (its identity hashed here, where it is served)."""
    from core.capabilities import Capability
    from core.serving import ServingContext
    from core.cache.identity import model_identity

    engine = ServingContext.of(settings, registry).engine(model, Capability.EMBEDDINGS)
    identity = await asyncio.to_thread(model_identity, engine)
    return {"name": engine.name, "identity": identity, "backend": engine.backend.name, "dtype": engine.spec.dtype,
            "device": engine.spec.device, "dimension": getattr(engine.task, "dimension", None)}


def _encode(vector: np.ndarray) -> bytes:
    return vector.dtype.str.encode().ljust(4) + np.ascontiguousarray(vector).tobytes()


def _decode(value: bytes) -> np.ndarray:
    return np.frombuffer(value, dtype=np.dtype(value[:4].strip().decode()), offset=4)


def run_modal_job(settings, options: JobOptions, embed_map: Callable[[list[list[str]], dict], Iterable],
                  describe: Callable[[], dict], *, shard_size: int = 2048, window: int = 8,
                  volume_of: Callable[[str], Any] | None = None) -> Summary:
    """The job with ``embed_map(shards, options)`` (the class's ``embed_shard.map``, in order) doing the
    model work and ``describe()`` (its ``describe_model``) naming the model. A ``volume://NAME/PATH`` input
    or output is read or written through ``volume_of(NAME)`` (default ``modal.Volume.from_name``;
    core/bulk/modal_volume.py)."""
    from core.bulk.modal_volume import VolumeFiles, is_volume, refuse_same_volume_file
    from core.bulk.store import SqliteStore

    started = time.monotonic()
    summary = Summary(output=options.output)
    refuse_same_volume_file(options)
    volumes = None
    if is_volume(options.input) or is_volume(options.output):
        volumes = VolumeFiles(options, settings.cache_dir, volume_of or _volume_from_name)
    local = volumes.local_options if volumes is not None else options
    refuse_crossed_paths(local.input, local.output, local.work_folder(settings.cache_dir))  # before the model's
    model = describe()
    if options.dimensions:
        model["dimension"] = options.dimensions
    description = {"input": options.input, "format": formats.detect_format(options.input, options.format),
                   "text_column": options.text_column, "id_column": options.id_column,
                   "model": {"served": model["name"], "identity": model["identity"]},
                   "options": options.vector_options()}
    if volumes is not None:
        volumes.fetch_input()
        options = volumes.local_options  # the job runs on this machine's copies; its description keeps the URIs
    state = begin(settings, options, summary, description)
    if state is None:
        if volumes is not None:
            volumes.publish_output()
        return summary
    try:
        if not state.complete:
            record_model(state.work, model)
            store = SqliteStore(state.work / "vectors.sqlite")
            prefix = hashlib.blake2b(json.dumps(description, sort_keys=True).encode(), digest_size=16).digest()
            try:
                _embed_parts(store, prefix, options, state.work, state.resume, model, summary, embed_map,
                             shard_size, window, text_limit(settings, options))
            finally:
                asyncio.run(store.close())
        finish(state, options, summary, started)
    finally:
        state.folder.release()
    if volumes is not None:
        volumes.publish_output()
    return summary


def _volume_from_name(name: str):
    from core.errors import require

    return require("modal", "modal").Volume.from_name(name)


def _embed_parts(store, prefix: bytes, options, work: Path, resume: int, model: dict, summary: Summary, embed_map,
                 shard_size: int, window: int, limit: formats.TextLimit) -> None:
    chunks = formats.read_chunks(options.input, fmt=options.format, text_column=options.text_column,
                                 id_column=options.id_column, rows=options.rows_per_part, skip=resume, limit=limit)
    metadata = {"model": model, "options": options.vector_options()}
    kwargs = shard_options(options)
    id_name = options.id_column or "id"
    done = False
    while not done:
        group = []
        for chunk in chunks:
            group.append(chunk)
            if len(group) == window:
                break
        else:
            done = True
        if not group:
            break
        keys = [[hashlib.blake2b(prefix + t.encode("utf-8", "surrogatepass"), digest_size=20).digest()
                 for t in chunk.texts] for chunk in group]
        text_of = {}
        for chunk, chunk_keys in zip(group, keys):
            for key, text in zip(chunk_keys, chunk.texts):
                text_of.setdefault(key, text)
        distinct = list(text_of)
        found = dict(zip(distinct, asyncio.run(store.get_many(distinct))))
        missing = [k for k in distinct if found[k] is None]
        vectors = {k: _decode(v) for k, v in found.items() if v is not None}
        shards = [missing[i:i + shard_size] for i in range(0, len(missing), shard_size)]
        new = {}
        for shard, result in zip(shards, embed_map([[text_of[k] for k in shard] for shard in shards], kwargs)):
            result = np.asarray(result)
            if len(result) != len(shard):
                raise JobError(f"a shard of {len(shard)} texts came back with {len(result)} vectors")
            for key, vector in zip(shard, result):
                vectors[key] = vector
                new[key] = _encode(vector)
        if len(new) != len(missing):
            raise JobError(f"{len(missing) - len(new)} texts came back without a vector")
        asyncio.run(store.set_many(new))
        rows = sum(len(chunk.texts) for chunk in group)
        summary.computed += len(missing)
        summary.repeated += rows - len(missing)
        for chunk, chunk_keys in zip(group, keys):
            write_part(work, chunk.start, chunk.ids, np.stack([vectors[k] for k in chunk_keys]), metadata, id_name)
            summary.rows_this_run += len(chunk.texts)


def run_modal(settings, options: JobOptions, *, app_name: str = "tessera", shard_size: int = 2048) -> Summary:
    """``--on modal``: the deployed app's class (``modal deploy adapters/modal/app.py``)."""
    from core.errors import require

    modal = require("modal", "modal")
    tessera = modal.Cls.from_name(app_name, "Tessera")()
    try:
        return run_modal_job(
            settings, options,
            embed_map=lambda shards, kwargs: tessera.embed_shard.map(
                shards, kwargs={"model": options.model, "options": kwargs}, order_outputs=True),
            describe=lambda: tessera.describe_model.remote(options.model), shard_size=shard_size)
    except modal.exception.Error as exc:  # the parts written so far stay: the same command resumes
        raise JobError(f"Modal: {exc} (the app must be deployed: modal deploy adapters/modal/app.py, with "
                       f"--modal-app naming it; got {app_name!r}; a volume:// file is on a Volume of the same "
                       "account)") from None
