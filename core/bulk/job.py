"""``python -m core embed``: a corpus through the same engine and settings as the server, in-process.

The input is read in chunks of ``rows_per_part`` rows. Per chunk: each distinct text is looked up in the
job's store (an SQLite file in the work folder; with ``embedding_cache`` set, the shared cache behind it),
only the texts never seen go to the engine (in requests of ``request_texts``, ``concurrency`` of them in
flight, so the batcher stays full), and the chunk's ids and vectors are written as one part file, atomically
(written beside, then renamed). A killed job (SIGKILL included) resumes after its last whole part: parts
cover consecutive row ranges, so every id is written exactly once. When every row is in a part, the parts
are merged into the output file with the job's description in its metadata, and the job's files in the work
folder are deleted (core/bulk/workfolder.py: the job writes and deletes only its own files, holds a lock on the
folder while it runs, and never lets the output replace the input); the same command run again then finds the
output complete and does no model work.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from core.bulk import formats
from core.bulk.errors import JobError
from core.bulk.workfolder import WorkFolder, refuse_crossed_paths
from core.errors import TesseraError

EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")


@dataclass
class JobOptions:
    input: str
    output: str
    format: str = "auto"
    text_column: str = "text"
    id_column: str | None = None
    model: str | None = None  # served name (several models configured); None: the one configured
    # every /v1/embeddings option that changes a vector
    dimensions: int | None = None
    normalize: bool | None = None
    prompt: str | None = None
    prompt_name: str | None = None
    truncate: bool = True
    embedding_type: str = "float"
    chunking: Any = None  # the wire value: None (the model's default), False, True or {"size", "overlap"}
    # how the job runs (not part of the vectors)
    rows_per_part: int = 8192
    request_texts: int = 64
    concurrency: int = 16
    work_dir: str | None = None
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.embedding_type not in EMBEDDING_TYPES:
            raise JobError(f"--embedding-type must be one of {', '.join(EMBEDDING_TYPES)} (got {self.embedding_type!r})")
        for name in ("rows_per_part", "request_texts", "concurrency"):
            if getattr(self, name) <= 0:
                raise JobError(f"--{name.replace('_', '-')} must be positive")

    def vector_options(self) -> dict:
        return {"dimensions": self.dimensions, "normalize": self.normalize, "prompt": self.prompt,
                "prompt_name": self.prompt_name, "truncate": self.truncate, "chunking": self.chunking,
                "embedding_type": self.embedding_type}

    def request_options(self) -> dict:
        """``serving.embeddings.embed_request``'s keywords."""
        return {"dimensions": self.dimensions, "normalize": self.normalize, "prompt": self.prompt,
                "prompt_name": self.prompt_name, "truncate": self.truncate, "chunking": self.chunking}

    def work_folder(self, cache_dir: Path) -> Path:
        if self.work_dir:
            return Path(self.work_dir)
        if formats.is_uri(self.output):
            return Path(cache_dir) / "jobs" / hashlib.sha256(self.output.encode()).hexdigest()[:16]
        return Path(self.output + ".parts")


def text_limit(settings, options: JobOptions) -> formats.TextLimit:
    """The characters a row's text may have: the server's ``max_chars_per_item``, less a literal ``--prompt``
    (put before every text, it counts toward each item's characters as on /v1/embeddings)."""
    limit = settings.max_chars_per_item
    prompt = len(options.prompt or "")
    if not prompt:
        return formats.TextLimit(limit, f"max_chars_per_item is {limit}")
    return formats.TextLimit(limit - prompt, f"max_chars_per_item is {limit}, less the {prompt}-character --prompt")


def model_source(spec) -> dict:
    """What the job's description records of the model before loading it: its folder's files' hashes
    (a changed folder is another model), or a Hub id and revision."""
    from core.cache.identity import file_hash, folder_files

    path = Path(spec.path)
    if path.is_dir():
        digest = hashlib.blake2b(digest_size=16)
        for file in folder_files(path):
            digest.update(str(file.relative_to(path)).encode() + b"\0" + file_hash(file).encode())
        return {"files": digest.hexdigest()}
    return {"hub": str(spec.path), "revision": spec.revision}


def job_description(settings, options: JobOptions) -> dict:
    """What makes two runs the same job: the input and its columns, the model spec and files, the vector
    options. A resumed run must match it; a finished output whose metadata matches is not done again."""
    spec = select_spec(settings, options.model)
    spec_fields = spec.flat_dump(mode="json", exclude={"max_queue_items", "max_batch_size", "max_batch_tokens",
                                                        "threads", "workers", "ort_spin"})
    return {"input": options.input, "format": formats.detect_format(options.input, options.format),
            "text_column": options.text_column, "id_column": options.id_column, "model": spec_fields,
            "model_source": model_source(spec), "options": options.vector_options()}


def select_spec(settings, name: str | None):
    specs = settings.model_specs()
    if name is None:
        if len(specs) != 1:
            raise JobError(f"several models are configured; name one with --model-name (one of "
                           f"{[s.served_name for s in specs]})")
        return specs[0]
    for spec in specs:
        if spec.served_name == name:
            return spec
    raise JobError(f"no configured model is served as {name!r}; configured: {[s.served_name for s in specs]}")


@dataclass
class Summary:
    rows: int = 0  # rows in the output
    rows_this_run: int = 0
    resumed_from: int = 0  # rows found done when this run started
    computed: int = 0  # distinct texts the model embedded in this run
    repeated: int = 0  # rows answered by the job's store (a text seen before in the job)
    from_cache: int = 0  # texts answered by the shared embedding cache
    seconds: float = 0.0
    already_complete: bool = False
    output: str = ""

    @property
    def rate(self) -> float:
        return self.rows_this_run / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        if self.already_complete:
            return [f"{self.output}: already complete ({self.rows} rows); nothing to do"]
        return [f"rows: {self.rows} ({self.rows_this_run} this run, {self.resumed_from} done before)",
                f"unique texts embedded: {self.computed}; repeats answered from the job: {self.repeated}; "
                f"from the shared cache: {self.from_cache}",
                f"seconds: {self.seconds:.1f}; embeddings/s: {self.rate:.1f}", f"output: {self.output}"]


class ChunkEmbedder:
    """One model copy embedding chunks of texts through the job's store: what ``--on local`` runs in this
    process and each Ray actor / Modal container runs for its shards."""

    def __init__(self, settings, options: JobOptions, store=None, registry=None) -> None:
        self.settings = settings
        self.options = options
        self._store = store
        self._registry = registry
        self.engine = None
        self.cache = None
        self.serving = None
        self._template = None
        self._prefix = b""
        self._expected = None

    async def start(self) -> "ChunkEmbedder":
        from core.capabilities import Capability
        from core.serving import ServingContext
        from core.serving.embeddings import embed_request
        from core.serving.inputs import truncation_direction
        from core.cache import EmbeddingCache, expected_value
        from core.cache.stores import MemoryStore
        from core.engine import Registry

        if self._registry is None:
            self._registry = await asyncio.to_thread(Registry.from_settings, self.settings)
            self._registry.raise_if_unusable(allow_degraded=True)
        await self._registry.ensure_started()
        spec = select_spec(self.settings, self.options.model)
        self.engine = self._registry.get(spec.served_name, Capability.EMBEDDINGS)
        store = self._store if self._store is not None else MemoryStore(self.settings.embedding_cache_bytes)
        self.cache = EmbeddingCache(store)
        self.serving = ServingContext.of(self.settings, self._registry)
        self.serving.embedding_cache = None  # the job's store is its cache
        self._template = embed_request(self.settings, ["x"], **self.options.request_options())
        self._template.truncation_direction = truncation_direction(None, self.engine.task)
        if self.engine.task.name != "embed":
            raise JobError(f"model {self.engine.name!r} ({self.engine.task.name}) gives no single vector per text; "
                           "python -m core embed serves dense embedding models")
        self.identity = await self.cache.identity(self.engine)
        self._prefix = self.cache.prefix(self.identity, self._template)
        self._expected = expected_value(self.engine, self._template)  # what a stored value must hold to be used
        return self

    def model_metadata(self) -> dict:
        return {"name": self.engine.name, "identity": self.identity, "backend": self.engine.backend.name,
                "dtype": self.engine.spec.dtype, "device": self.engine.spec.device,
                "dimension": self.options.dimensions or self.engine.task.dimension}

    async def _run(self, texts: list[str]):
        from core.serving.embeddings import embed_request

        request = embed_request(self.settings, texts, **self.options.request_options())
        request.truncation_direction = self._template.truncation_direction
        return await self.engine(request, deadline=None)

    async def embed(self, texts: list[str], where: Callable[[int], str] | None = None) -> np.ndarray:
        """The chunk's vectors in order (quantized as the job asks); each distinct text the store lacks
        runs once. ``where(i)`` names text ``i`` in the input (a refused text's error names its row)."""
        from core.serving.embeddings import quantized
        from core.cache import decode_value, encode_value

        cache = self.cache
        keys = [cache.key(self._prefix, t) for t in texts]
        distinct = list(dict.fromkeys(keys))
        first_at = {k: i for i, k in reversed(list(enumerate(keys)))}
        found = dict(zip(distinct, await cache.lookup(distinct, self.engine.name, self._expected)))
        first_text = dict(zip(reversed(keys), reversed(texts)))
        missing = [k for k in distinct if found[k] is None]
        vectors: dict[bytes, np.ndarray] = {k: decode_value(v)[0] for k, v in found.items() if v is not None}
        step = self.options.request_texts
        gate = asyncio.Semaphore(self.options.concurrency)

        async def one(part: list[bytes]) -> None:
            async with gate:
                try:
                    result = await self._run([first_text[k] for k in part])
                except TesseraError as exc:
                    if where is not None:
                        name_row(exc, lambda j: where(first_at[part[j]]))
                    raise
            new = {}
            for k, vector, tokens in zip(part, result.vectors, result.input_tokens):
                vectors[k] = vector
                new[k] = encode_value(vector, tokens)
            await cache.save(new)

        await asyncio.gather(*(one(missing[i:i + step]) for i in range(0, len(missing), step)))
        cache.hits += len(texts) - len(missing)
        cache.misses += len(missing)
        out = np.stack([vectors[k] for k in keys]) if keys else np.zeros((0, self.model_metadata()["dimension"] or 0),
                                                                          np.float32)
        if self.options.embedding_type != "float" and len(out):
            out = await quantized(self.serving, self.engine, self._template, out, self.options.embedding_type, None)
        return out

    async def close(self) -> None:
        if self.cache is not None:
            await self.cache.close()
        if self._registry is not None:
            await self._registry.stop(drain=True, timeout=self.settings.shutdown_grace_s)


_REQUEST_ITEM = re.compile(r"input\[(\d+)\]")


def name_row(exc: TesseraError, where: Callable[[int], str]) -> None:
    """An engine error about ``input[j]`` of one of the job's internal requests, reworded to name the row of
    the input it came from (``where(j)``): the request's place means nothing to the job's user."""
    match = _REQUEST_ITEM.match(exc.message)
    if match is not None:
        exc.message = where(int(match.group(1))) + exc.message[match.end():]
        exc.args = (exc.message,)


# --- the work folder ------------------------------------------------------------------------------------

PART = "part-{start:012d}-{end:012d}.parquet"


def done_parts(work: Path) -> list[tuple[int, int, Path]]:
    """The whole parts, consecutive from row 0 (a part after a gap, which a crash cannot leave, is dropped)."""
    parts = []
    for path in work.glob("part-*.parquet"):
        _, start, end = path.stem.split("-")
        parts.append((int(start), int(end), path))
    parts.sort()
    whole, at = [], 0
    for start, end, path in parts:
        if start != at:
            break
        whole.append((start, end, path))
        at = end
    return whole


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def prepare_work(work: Path, options: JobOptions, description: dict) -> WorkFolder:
    """The job's work folder taken (core/bulk/workfolder.py: made or found empty, or the job's own; locked)
    and checked to hold this job's parts, if any. The lock is held until the folder is removed or released."""
    folder = WorkFolder.take(work, input=options.input, output=options.output, description=description)
    try:
        job_file = work / "job.json"
        if job_file.exists():
            recorded = json.loads(job_file.read_text())
            if recorded != description:
                changed = sorted(k for k in set(recorded) | set(description) if recorded.get(k) != description.get(k))
                raise JobError(f"{work} holds part of another job (it differs in: {', '.join(changed)}); run the "
                               "same command to resume it, or remove the folder to start this one")
        else:
            write_atomic(job_file, lambda p: p.write_text(json.dumps(description, sort_keys=True)))
    except BaseException:
        folder.release()
        raise
    return folder


# --- the job --------------------------------------------------------------------------------------------


@dataclass
class WorkState:
    """A job's work folder as found at the start of a run: where it is and the rows already in parts."""

    folder: WorkFolder  # taken and locked for this run
    description: dict
    resume: int
    complete: bool  # every input row is in a part: only the merge is left

    @property
    def work(self) -> Path:
        return self.folder.path


def begin(settings, options: JobOptions, summary: Summary, description: dict | None = None) -> WorkState | None:
    """Check the input, the output and the work folder. None: the output is already this job's, whole.
    ``description``: the job's (default :func:`job_description`; a remote model describes itself). The work
    folder comes back locked: :func:`finish` removes it, a run that stops early releases it
    (``state.folder.release()``)."""
    if not formats.is_uri(options.input) and not Path(options.input).is_file():
        raise JobError(f"--input {options.input}: no such file")
    work = options.work_folder(settings.cache_dir)
    refuse_crossed_paths(options.input, options.output, work)
    formats.pyarrow()  # the [bulk] extra, before any work
    description = description or job_description(settings, options)
    if not options.overwrite and _output_complete(options.output, description, summary):
        return None
    folder = prepare_work(work, options, description)
    parts = done_parts(work)
    summary.resumed_from = parts[-1][1] if parts else 0
    return WorkState(folder, description, summary.resumed_from, (work / "complete.json").exists())


def record_model(work: Path, model: dict) -> None:
    """The model that writes the parts: a resumed job must be embedded by the same build."""
    recorded = work / "model.json"
    if recorded.exists():
        before = json.loads(recorded.read_text())["identity"]
        if before != model["identity"]:
            raise JobError(f"{work}: its parts were written by another build of the model (identity {before}, now "
                           f"{model['identity']}); remove the folder to start again")
    write_atomic(recorded, lambda p: p.write_text(json.dumps(model, sort_keys=True)))


def write_part(work: Path, start: int, ids: list, vectors, metadata: dict, id_name: str) -> None:
    pq = formats.require("pyarrow.parquet", "bulk")
    schema = formats.output_schema(id_name, ids[0] if ids else None, vectors, metadata)
    table = formats.table_of(schema, ids, vectors)
    write_atomic(work / PART.format(start=start, end=start + len(ids)),
                 lambda p: pq.write_table(table, str(p), row_group_size=formats.row_group_rows(schema),
                                          **formats.writer_options(schema)))


def finish(state: WorkState, options: JobOptions, summary: Summary, started: float) -> Summary:
    """Every row is in a part: mark it, merge the parts into the output, delete the job's files from the work
    folder (and the folder, if the job made it) and release its lock."""
    work = state.work
    if not state.complete:
        parts = done_parts(work)
        write_atomic(work / "complete.json", lambda p: p.write_text(json.dumps({"rows": parts[-1][1] if parts else 0})))
    model = json.loads((work / "model.json").read_text()) if (work / "model.json").exists() else {}
    summary.rows = merge_parts(work, options.output, {"job": state.description, "model": model,
                                                      "options": options.vector_options()})
    state.folder.remove()
    summary.seconds = time.monotonic() - started
    return summary


async def run_local(settings, options: JobOptions, progress=None) -> Summary:
    """The whole job in this process (``--on local``)."""
    started = time.monotonic()
    summary = Summary(output=options.output)
    state = begin(settings, options, summary)
    if state is None:
        return summary
    try:
        if not state.complete:
            embedder = await ChunkEmbedder(settings, options, store=_job_store(settings, state.work)).start()
            try:
                record_model(state.work, embedder.model_metadata())
                await _embed_parts(embedder, options, state.work, state.resume, summary, progress)
            finally:
                await embedder.close()
            summary.computed = embedder.cache.misses
            summary.from_cache = getattr(embedder.cache.store, "shared_hits", 0)
            summary.repeated = embedder.cache.hits - summary.from_cache
        finish(state, options, summary, started)
    finally:
        state.folder.release()
    if progress is not None:
        progress.finish()
    return summary


def _job_store(settings, work: Path):
    from core.bulk.store import SqliteStore, TieredStore
    from core.cache import build_cache

    local = SqliteStore(work / "vectors.sqlite")
    shared = build_cache(settings)
    return local if shared is None else TieredStore(local, shared.store)


def _output_complete(output: str, description: dict, summary: Summary) -> bool:
    exists = formats.is_uri(output) or Path(output).exists()
    meta = formats.read_metadata(output) if exists else None
    if meta is None:
        if exists and not formats.is_uri(output):
            raise JobError(f"--output {output} exists and is not this job's output; remove it or pass --overwrite")
        return False
    if meta.get("job") != description:
        raise JobError(f"--output {output} holds another job's vectors (other input, model or options); remove it "
                       "or pass --overwrite")
    summary.rows = int(meta.get("rows", 0))
    summary.already_complete = True
    return True


async def _embed_parts(embedder: ChunkEmbedder, options: JobOptions, work: Path, resume: int, summary: Summary,
                       progress) -> None:
    chunks = formats.read_chunks(options.input, fmt=options.format, text_column=options.text_column,
                                 id_column=options.id_column, rows=options.rows_per_part, skip=resume,
                                 limit=text_limit(embedder.settings, options))
    id_name = options.id_column or "id"
    metadata = {"model": embedder.model_metadata(), "options": options.vector_options()}
    if progress is not None:
        progress.start(resume)
    writing: asyncio.Future | None = None
    next_chunk = asyncio.ensure_future(asyncio.to_thread(next, chunks, None))
    while True:
        chunk = await next_chunk
        if chunk is None:
            break
        next_chunk = asyncio.ensure_future(asyncio.to_thread(next, chunks, None))  # read ahead while embedding
        vectors = await embedder.embed(chunk.texts, chunk.where)
        if writing is not None:
            await writing
        writing = asyncio.ensure_future(asyncio.to_thread(write_part, work, chunk.start, chunk.ids, vectors, metadata,
                                                          id_name))
        summary.rows_this_run += len(chunk.texts)
        if progress is not None:
            progress.update(chunk.start + len(chunk.texts), embedder.cache.misses)
    if writing is not None:
        await writing


def merge_parts(work: Path, output: str, metadata: dict) -> int:
    """The parts, in row order, into ``output`` (written beside it and renamed; a URI is written in place),
    with ``metadata`` (and the row count) under the ``tessera`` key. Returns the rows.

    Memory stays that of one row group (:func:`formats.row_group_rows`) whatever the number of parts: each
    part is read a row group at a time, in this thread, and written in row groups of that size (rows left
    at a part's end are carried into the next part's first group, so every group but the last is whole)."""
    pa = formats.pyarrow()
    pq = formats.require("pyarrow.parquet", "bulk")
    parts = done_parts(work)
    rows = parts[-1][1] if parts else 0
    full = {**metadata, "rows": rows}
    if parts:
        schema = pq.read_schema(parts[0][2])
    else:
        schema = pa.schema([pa.field("id", pa.int64()), pa.field("embedding", pa.list_(pa.float32(), 1))])
    schema = schema.with_metadata({formats.METADATA_KEY: json.dumps(full, sort_keys=True).encode()})

    group = formats.row_group_rows(schema)

    def write(target) -> None:
        with pq.ParquetWriter(target, schema, **formats.writer_options(schema)) as writer:
            pending, held = [], 0  # batches not yet written: fewer than `group` rows between parts
            for _, _, path in parts:
                source = pq.ParquetFile(path, pre_buffer=False)
                for batch in source.iter_batches(batch_size=group, use_threads=False):
                    pending.append(batch.replace_schema_metadata(schema.metadata))
                    held += batch.num_rows
                    if held >= group:
                        table = pa.Table.from_batches(pending, schema)
                        whole = held - held % group
                        writer.write_table(table.slice(0, whole), row_group_size=group)
                        pending = table.slice(whole).to_batches() if whole < held else []
                        held -= whole
                source.close()
            if held:
                writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=group)

    if formats.is_uri(output):
        fs_mod = formats.require("pyarrow.fs", "bulk")
        fs, inner = fs_mod.FileSystem.from_uri(output)
        with fs.open_output_stream(inner) as stream:
            write(stream)
    else:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(output), lambda p: write(str(p)))
    return rows


