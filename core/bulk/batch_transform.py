"""SageMaker Batch Transform with the job's formats: ``python -m core batch-transform prepare`` writes a corpus
as the JSON Lines records the SageMaker container takes (adapters/sagemaker/jsonlines.py), ``collect`` turns
the job's ``.out`` files back into the Parquet file ``python -m core embed`` writes for the same corpus.

``prepare --input CORPUS --output DIR`` reads the corpus as the local job does (Parquet, JSON Lines, CSV,
text; local or ``s3://``) and writes

- ``DIR/records/part-NNNNN.jsonl``: ``--records-per-file`` rows each, one request body of ``/v1/embeddings``
  per line: ``{"id": ID, "input": TEXT, "encoding_format": "base64", ...the vector options}`` (the route
  ignores ``id``; base64 carries the float32 values exactly). ``DIR/records/`` is the transform job's
  ``S3Uri`` (``SplitType=Line``, ``ContentType=application/jsonlines``, ``BatchStrategy=MultiRecord``,
  ``AssembleWith=Line``);
- ``DIR/tessera-batch.json`` (outside the records, so the transform job never reads it): the job's
  description and the model's (identity, backend, dtype, dimension), taken from the same model the
  container serves, loaded here once, and each records file's first row and row count.

Batch Transform writes, for each input object ``part-NNNNN.jsonl``, ``part-NNNNN.jsonl.out`` under the
output path, its answers in the order of the file's lines. ``collect --prepared DIR --results OUT
--output vectors.parquet`` pairs line *i* of each ``.out`` with line *i* of its records file (the id
comes from the records file, so ids survive whatever they are); a job run with ``JoinSource=Input``
writes each record with its answer under ``SageMakerOutput``: then the record's own id and text are
checked against the prepared line too. Every answer must be a vector of the prepared model (its served
name) with the prepared width; a record that failed (an error line) fails the collect, naming the ids. The
vectors are written by the local job's own writer (parts in a work folder, then the merge), with the same
metadata, so the file is the one ``python -m core embed`` writes for that corpus and options, and
``embed`` run on it afterwards finds it complete.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.bulk import formats
from core.bulk.job import (
    ChunkEmbedder,
    JobError,
    JobOptions,
    Summary,
    WorkState,
    _output_complete,
    done_parts,
    finish,
    job_description,
    prepare_work,
    record_model,
    text_limit,
    write_part,
)
from core.bulk.workfolder import refuse_crossed_paths

MANIFEST = "tessera-batch.json"
RECORDS = "records"
FILE = "part-{index:05d}.jsonl"
FORMAT = "tessera-batch-transform/1"
#: the vectors' type in the local job's output, per embedding_type (core/quantize.py)
VECTOR_DTYPES = {"float": np.float32, "int8": np.int8, "binary": np.int8, "uint8": np.uint8, "ubinary": np.uint8}


def record_fields(options: JobOptions) -> dict:
    """The ``/v1/embeddings`` fields every record carries: the job's vector options, base64 vectors."""
    fields: dict = {"encoding_format": "base64"}
    for name in ("dimensions", "normalize", "prompt", "prompt_name", "chunking"):
        value = getattr(options, name)
        if value is not None:
            fields[name] = value
    if not options.truncate:
        fields["truncate"] = False
    if options.embedding_type != "float":
        fields["embedding_type"] = options.embedding_type
    return fields


def _join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *names])


def _write(path: str, data: bytes) -> None:
    """``data`` to a local path (written beside, then renamed) or a URI pyarrow's filesystems open."""
    if formats.is_uri(path):
        fs_mod = formats.require("pyarrow.fs", "bulk")
        fs, inner = fs_mod.FileSystem.from_uri(path)
        if isinstance(fs, fs_mod.LocalFileSystem):  # object stores have no folders (no marker objects made)
            fs.create_dir(inner.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(inner) as stream:
            stream.write(data)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(target)


def _lines(path: str):
    """The lines of a local path or URI, as bytes without their line end."""
    stream = formats.open_input(path)
    try:
        pending = b""
        while True:
            block = stream.read(1 << 20)
            if not block:
                break
            pending += block
            *whole, pending = pending.split(b"\n")
            for line in whole:
                yield line.removesuffix(b"\r")
        if pending:
            yield pending.removesuffix(b"\r")
    finally:
        stream.close()


@dataclass
class Prepared:
    files: int
    rows: int
    records: str  # the transform job's input prefix
    manifest: str

    def lines(self) -> list[str]:
        return [f"rows: {self.rows} in {self.files} records file(s) under {self.records}/ (the transform job's input)",
                f"manifest: {self.manifest} (collect reads it; not an input of the transform job)"]


async def prepare(settings, options: JobOptions, out_dir: str, records_per_file: int = 100_000) -> Prepared:
    """The corpus as Batch Transform's input records, and the manifest ``collect`` reads."""
    if records_per_file <= 0:
        raise JobError("--records-per-file must be positive")
    if not formats.is_uri(options.input) and not Path(options.input).is_file():
        raise JobError(f"--input {options.input}: no such file")
    formats.pyarrow()  # the [bulk] extra, before any work
    description = job_description(settings, options)
    from core.cache.stores import MemoryStore

    embedder = await ChunkEmbedder(settings, options, store=MemoryStore(1 << 20)).start()
    try:  # the model's identity and dimension as the local job records them; the options checked by the model
        model = embedder.model_metadata()
    finally:
        await embedder.close()
    fields = record_fields(options)
    files, rows = [], 0
    chunks = formats.read_chunks(options.input, fmt=options.format, text_column=options.text_column,
                                 id_column=options.id_column, rows=records_per_file,
                                 limit=text_limit(settings, options))
    for index, chunk in enumerate(chunks):
        body = bytearray()
        for offset, (row_id, text) in enumerate(zip(chunk.ids, chunk.texts)):
            if not isinstance(row_id, (int, str)) or isinstance(row_id, bool):
                raise JobError(f"row {chunk.start + offset}: the id {row_id!r} ({type(row_id).__name__}) cannot "
                               "travel in a JSON record; ids must be integers or strings")
            body += json.dumps({"id": row_id, "input": text, **fields}, ensure_ascii=False).encode() + b"\n"
        name = FILE.format(index=index)
        _write(_join(out_dir, RECORDS, name), bytes(body))
        files.append({"file": name, "start": chunk.start, "rows": len(chunk.texts)})
        rows += len(chunk.texts)
    manifest = {"format": FORMAT, "job": description, "model": model, "options": options.vector_options(),
                "id_column": options.id_column or "id", "rows": rows, "files": files}
    path = _join(out_dir, MANIFEST)
    _write(path, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return Prepared(len(files), rows, _join(out_dir, RECORDS), path)


def read_manifest(prepared: str) -> dict:
    path = _join(prepared, MANIFEST)
    try:
        manifest = json.loads(b"".join(line + b"\n" for line in _lines(path)))
    except (formats.InvalidInput, OSError):
        raise JobError(f"--prepared {prepared}: no {MANIFEST} (the folder `batch-transform prepare` wrote)") from None
    except json.JSONDecodeError as exc:
        raise JobError(f"{path}: not a manifest ({exc})") from None
    if manifest.get("format") != FORMAT:
        raise JobError(f"{path}: not a manifest of this version (format {manifest.get('format')!r}, want {FORMAT})")
    return manifest


def _vector(answer: dict, where: str, model: dict, dtype, width: int | None) -> np.ndarray:
    if answer.get("model") != model["name"]:
        raise JobError(f"{where}: answered by model {answer.get('model')!r}, but the records were prepared for "
                       f"{model['name']!r}; prepare with the model the container serves, under its served name")
    data = answer.get("data")
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0].get("embedding"), str):
        raise JobError(f"{where}: not a one-vector base64 embeddings answer")
    vector = np.frombuffer(base64.b64decode(data[0]["embedding"]), dtype="<f4")
    if width is not None and len(vector) != width:
        raise JobError(f"{where}: a vector of {len(vector)} values, the others have {width}")
    return vector.astype(dtype)


def _file_vectors(prepared: str, results: str, entry: dict, model: dict, dtype, width: int | None):
    """(ids, vectors, failures) of one records file and its ``.out``."""
    records = _join(prepared, RECORDS, entry["file"])
    out = _join(results, entry["file"] + ".out")
    answers = (line for line in _lines(out) if line.strip())  # AssembleWith=Line may add empty lines
    ids, vectors, failures = [], [], []
    for number, record_line in enumerate(_lines(records), 1):
        record = json.loads(record_line)
        where = f"{out}, line {number} (id {record['id']!r})"
        line = next(answers, None)
        if line is None:
            raise JobError(f"{out}: {number - 1} answer(s) for the {entry['rows']} records of {records}; was the "
                           "job run with SplitType=Line and AssembleWith=Line, and did it finish?")
        answer = json.loads(line)
        if isinstance(answer, dict) and "SageMakerOutput" in answer:  # JoinSource=Input: the record, joined
            if answer.get("id") != record["id"] or answer.get("input") != record["input"]:
                raise JobError(f"{where}: joins the record id {answer.get('id')!r}, not the prepared line's")
            answer = answer["SageMakerOutput"]
        if not isinstance(answer, dict):
            raise JobError(f"{where}: not an embeddings answer")
        if "error" in answer:
            failures.append(f"id {record['id']!r}: {answer['error'].get('message')}")
            continue
        vector = _vector(answer, where, model, dtype, width)
        width = len(vector)
        ids.append(record["id"])
        vectors.append(vector)
    if next(answers, None) is not None:
        raise JobError(f"{out}: more answers than the {entry['rows']} records of {records}")
    return ids, vectors, failures


def collect(settings, prepared: str, results: str, output: str, *, overwrite: bool = False,
            work_dir: str | None = None) -> Summary:
    """The ``.out`` files under ``results`` into ``output``: the local job's Parquet for the prepared corpus."""
    started = time.monotonic()
    manifest = read_manifest(prepared)
    description, model = manifest["job"], manifest["model"]
    formats.pyarrow()
    options = JobOptions(input=description["input"], output=output, text_column=description["text_column"],
                         id_column=description["id_column"], work_dir=work_dir, overwrite=overwrite,
                         **manifest["options"])
    summary = Summary(output=output)
    work = options.work_folder(settings.cache_dir)
    refuse_crossed_paths(options.input, output, work)
    if not overwrite and _output_complete(output, description, summary):
        return summary
    folder = prepare_work(work, options, description)
    try:
        return _collect_parts(prepared, results, manifest, options, WorkState(folder, description, 0, False),
                              summary, started)
    finally:
        folder.release()


def _collect_parts(prepared: str, results: str, manifest: dict, options: JobOptions, state: WorkState,
                   summary: Summary, started: float) -> Summary:
    description, model, work = state.description, manifest["model"], state.work
    record_model(work, model)
    parts = done_parts(work)
    resume = parts[-1][1] if parts else 0
    summary.resumed_from = resume
    dtype = VECTOR_DTYPES[options.embedding_type]
    width = None
    failures: list[str] = []
    for entry in manifest["files"]:
        if entry["start"] + entry["rows"] <= resume:
            continue
        ids, vectors, failed = _file_vectors(prepared, results, entry, model, dtype, width)
        if failed:
            failures += failed
            continue
        width = len(vectors[0]) if vectors else width
        if not failures:  # parts stay consecutive: none after a file with failed records
            write_part(work, entry["start"], ids, np.stack(vectors) if vectors else np.zeros((0, width or 0), dtype),
                       {"model": model, "options": options.vector_options()}, manifest["id_column"])
            summary.rows_this_run += len(ids)
    if failures:
        raise JobError(f"{len(failures)} record(s) answered an error, so the output is not written (the files "
                       f"before the first such record are kept as parts): " + "; ".join(failures[:5])
                       + ("; ..." if len(failures) > 5 else ""))
    state.resume = resume
    return finish(state, options, summary, started)
