"""Reading a corpus and writing its vectors: Parquet, JSON Lines, CSV or plain text lines in (a local path,
or ``s3://`` and the other URIs pyarrow's filesystems open), Parquet out. Everything streams in record
batches; nothing holds the corpus."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from core.errors import InvalidInput, TooLarge, require

FORMATS = ("parquet", "jsonl", "csv", "text")
#: the key of the output file's metadata holding the job's description (model identity, options, ...)
METADATA_KEY = b"tessera"


def pyarrow():
    return require("pyarrow", "bulk")


def detect_format(uri: str, given: str = "auto") -> str:
    if given != "auto":
        if given not in FORMATS:
            raise InvalidInput(f"--format must be auto or one of {', '.join(FORMATS)} (got {given!r})")
        return given
    name = uri.lower().removesuffix(".gz").removesuffix(".zst")
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if name.endswith((".csv", ".tsv")):
        return "csv"
    return "text"


def is_uri(path: str) -> bool:
    """``s3://``, ``gs://``, ``file://``...: opened through pyarrow's filesystems (``s3fs`` is not needed: pyarrow
    has its own S3 client)."""
    return "://" in path


def open_input(path: str):
    """A readable binary stream of ``path`` (local, or a URI pyarrow's filesystems know: ``s3://``, ``gs://``)."""
    pa = pyarrow()
    if is_uri(path):
        fs_mod = require("pyarrow.fs", "bulk")
        fs, inner = fs_mod.FileSystem.from_uri(path)
        compression = "detect"
        return fs.open_input_stream(inner, compression=compression)
    if not Path(path).exists():
        raise InvalidInput(f"--input {path}: no such file")
    return pa.input_stream(path, compression="detect")


def input_rows(path: str) -> int | None:
    """The row count where the format says it cheaply (Parquet's footer), else None."""
    if detect_format(path) != "parquet":
        return None
    pq = require("pyarrow.parquet", "bulk")
    try:
        return pq.ParquetFile(_random_access(path)).metadata.num_rows
    except (OSError, ValueError):
        return None


def _random_access(path: str):
    if is_uri(path):
        fs_mod = require("pyarrow.fs", "bulk")
        fs, inner = fs_mod.FileSystem.from_uri(path)
        return fs.open_input_file(inner)
    return path


@dataclass(slots=True)
class Chunk:
    start: int  # the input row number of the first row
    ids: list  # one per row: the id column's value, or the row number
    texts: list[str]

    def where(self, i: int) -> str:
        """Row ``i`` of the chunk as an error names it: its row number in the input and its id."""
        return row_name(self.start + i, self.ids[i])


def row_name(row: int, row_id: Any) -> str:
    return f"row {row} (id {row_id!r})"


@dataclass(frozen=True, slots=True)
class TextLimit:
    """The most characters a row's text may have, and why (the setting it comes from), for the error."""

    chars: int
    reason: str

    def refuse(self, row: int, row_id: Any, chars: int | str) -> TooLarge:
        return TooLarge(f"{row_name(row, row_id)}: the text has {chars} characters; {self.reason}", param="input")


def read_chunks(path: str, *, fmt: str = "auto", text_column: str = "text", id_column: str | None = None,
                rows: int = 8192, skip: int = 0, limit: TextLimit | None = None) -> Iterator[Chunk]:
    """The input's rows in chunks of exactly ``rows`` (the last may be shorter), from row ``skip`` on
    (a resumed job: earlier rows are read past, not returned). Row numbers count every input row (a text
    file: every line; blank lines are left out but keep their numbers). A text over ``limit`` stops the
    read with an error naming its row and id, before it is hashed or tokenized: Parquet and CSV columns are
    measured in Arrow (from the string offsets) before they become Python strings, a text file's lines are
    read at most ``limit`` characters at a time."""
    fmt = detect_format(path, fmt)
    pending_ids: list = []
    pending_texts: list = []
    start = skip
    for first, ids, texts in _batches(path, fmt, text_column, id_column, rows, skip, limit):
        end = first + len(texts)
        if end <= skip:
            continue
        if first < skip:
            ids, texts, first = ids[skip - first:], texts[skip - first:], skip
        pending_ids.extend(ids)
        pending_texts.extend(texts)
        while len(pending_texts) >= rows:
            yield Chunk(start, pending_ids[:rows], pending_texts[:rows])
            pending_ids, pending_texts = pending_ids[rows:], pending_texts[rows:]
            start += rows
    if pending_texts:
        yield Chunk(start, pending_ids, pending_texts)


def _check_texts(texts: list, first: int, ids: list) -> None:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidInput(f"row {first + i} (id {ids[i]!r}): the text is {'missing' if text is None else type(text).__name__}, not a string")


def _check_lengths(texts: list, first: int, ids: list, limit: TextLimit | None) -> None:
    if limit is None:
        return
    for i, text in enumerate(texts):
        if isinstance(text, str) and len(text) > limit.chars:
            raise limit.refuse(first + i, ids[i], len(text))


def _check_column_lengths(batch, text_column: str, id_column: str | None, first: int, limit: TextLimit | None) -> None:
    """The text column's lengths from Arrow's offsets (``utf8_length``: characters, as Python counts them),
    so a giant cell is refused before it becomes a Python string."""
    if limit is None:
        return
    pa = pyarrow()
    pc = require("pyarrow.compute", "bulk")
    column = batch.column(text_column)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        lengths = pc.utf8_length(column)
    elif pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        lengths = pc.binary_length(column)  # refused as not a string afterwards; measured first all the same
    else:
        return
    over = pc.greater(lengths, limit.chars)
    if not pc.any(over).as_py():
        return
    i = pc.index(over, True).as_py()
    row_id = batch.column(id_column)[i].as_py() if id_column else first + i
    raise limit.refuse(first + i, row_id, lengths[i].as_py())


#: a bound on what a text column chunk holds per row beside the text's bytes (its length prefix, a dictionary
#: index, levels, its share of page headers), and per chunk (the dictionary page's header...): generous
_CHUNK_ROW_OVERHEAD, _CHUNK_OVERHEAD = 128, 1 << 20


def _check_row_group_sizes(source, groups: list[int], first_row: int, text_column: str, id_column: str | None,
                           limit: TextLimit | None) -> None:
    """Refuse, from the footer alone, a row group whose text column is too big to hold only texts within
    ``limit``: when its uncompressed bytes exceed what its rows can take at 4 bytes a character, one of its
    texts is over the limit. Decoding such a cell costs pyarrow several times its size (4.2 GB for a 1 GB cell
    in a 34 KB zstd file), so it is refused before any page is read; the error names the group's rows (the
    cell itself cannot be found without decoding it)."""
    if limit is None:
        return
    meta = source.metadata
    column = next((j for j in range(meta.num_columns) if meta.row_group(0).column(j).path_in_schema == text_column),
                  None) if meta.num_row_groups else None
    if column is None:
        return
    at = first_row
    for group in groups:
        info = meta.row_group(group)
        size = info.column(column).total_uncompressed_size
        if size > info.num_rows * (4 * limit.chars + _CHUNK_ROW_OVERHEAD) + _CHUNK_OVERHEAD:
            last = at + info.num_rows - 1
            if id_column:
                ids = source.read_row_group(group, columns=[id_column]).column(0)
                first_id, last_id = ids[0].as_py(), ids[len(ids) - 1].as_py()
            else:
                first_id, last_id = at, last
            raise TooLarge(f"rows {at} to {last} (ids {first_id!r} to {last_id!r}): a text over the limit; the "
                           f"{text_column!r} column of these {info.num_rows} rows holds {size} bytes, more than "
                           f"{info.num_rows} texts within it take; {limit.reason}", param="input")
        at += info.num_rows


def _batches(path: str, fmt: str, text_column: str, id_column: str | None, rows: int, skip: int = 0,
             limit: TextLimit | None = None):
    """(first row number, ids, texts) per batch, in input order; rows before ``skip`` may be left out (counted,
    not parsed: a resumed job, or a Ray actor reading its part, reads past them cheaply)."""
    if fmt == "text":
        yield from _text_lines(path, rows, skip, limit)
        return
    if fmt == "jsonl":
        yield from _json_lines(path, text_column, id_column, rows, skip, limit)
        return
    columns = [text_column] + ([id_column] if id_column else [])
    if fmt == "parquet":
        pq = require("pyarrow.parquet", "bulk")
        source = pq.ParquetFile(_random_access(path))
        missing = [c for c in columns if c not in source.schema_arrow.names]
        if missing:
            raise InvalidInput(f"--input {path}: no column {missing[0]!r}; its columns: {source.schema_arrow.names}")
        groups, first_row = [], 0
        for group in range(source.metadata.num_row_groups):  # the row groups wholly before skip are not read
            size = source.metadata.row_group(group).num_rows
            if first_row + size <= skip and not groups:
                first_row += size
                continue
            groups.append(group)
        _check_row_group_sizes(source, groups, first_row, text_column, id_column, limit)
        batches = source.iter_batches(batch_size=rows, columns=columns, row_groups=groups)
    else:
        batches = _csv_batches(path, columns, text_column, limit)
    first = first_row if fmt == "parquet" else 0
    for batch in batches:
        _check_column_lengths(batch, text_column, id_column, first, limit)
        texts = batch.column(text_column).to_pylist()
        ids = batch.column(id_column).to_pylist() if id_column else list(range(first, first + len(texts)))
        _check_texts(texts, first, ids)
        yield first, ids, texts
        first += len(texts)


#: the CSV reader's block (a record must fit one): its default, or room for a text at the limit (4 bytes a
#: character in UTF-8, each doubled if all are quotes) and the rest of its record
CSV_BLOCK_BYTES = 1 << 20


def _csv_batches(path: str, columns: list[str], text_column: str, limit: TextLimit | None):
    csv = require("pyarrow.csv", "bulk")
    pa = pyarrow()
    delimiter = "\t" if path.lower().removesuffix(".gz").endswith(".tsv") else ","
    block = CSV_BLOCK_BYTES if limit is None else max(CSV_BLOCK_BYTES, 8 * limit.chars + CSV_BLOCK_BYTES)
    try:
        reader = csv.open_csv(open_input(path), read_options=csv.ReadOptions(block_size=block),
                              parse_options=csv.ParseOptions(delimiter=delimiter),
                              convert_options=csv.ConvertOptions(include_columns=columns,
                                                                 column_types={text_column: pa.string()}))
        yield from reader
    except pa.ArrowInvalid as exc:
        if "straddl" in str(exc) and limit is not None:
            raise TooLarge(f"--input {path}: a CSV record holds more than {block} bytes, more than any text within "
                           f"the limit takes ({limit.reason})", param="input") from None
        raise InvalidInput(f"--input {path}: {exc}") from None


def _bounded_lines(stream, limit: TextLimit | None, number_of: Callable[[], tuple[int, int]]):
    """The stream's lines, each read at most ``limit.chars`` characters (and its line end) at a time: a longer
    line is refused (counted to its end, never held) with the row and id ``number_of()`` gives."""
    if limit is None:
        yield from stream
        return
    while True:
        line = stream.readline(limit.chars + 1)
        if not line:
            return
        if len(line) > limit.chars and not line.endswith("\n"):
            chars = len(line)
            while True:
                rest = stream.readline(1 << 20)
                chars += len(rest.rstrip("\n"))
                if not rest or rest.endswith("\n"):
                    break
            row, row_id = number_of()
            raise limit.refuse(row, row_id, chars)
        yield line


def _text_lines(path: str, rows: int, skip: int = 0, limit: TextLimit | None = None):
    import io

    stream = io.TextIOWrapper(open_input(path), encoding="utf-8", newline=None)
    ids, texts, first, number = [], [], 0, 0
    for line in _bounded_lines(stream, limit, lambda: (first + len(texts), number)):
        text = line.rstrip("\n")
        if text.strip():
            if first < skip:  # a row before skip: counted only
                first += 1
                number += 1
                continue
            ids.append(number)
            texts.append(text)
        number += 1
        if len(texts) >= rows:
            yield first, ids, texts
            first, ids, texts = first + len(texts), [], []
    if texts:
        yield first, ids, texts


def _json_lines(path: str, text_column: str, id_column: str | None, rows: int, skip: int = 0,
                limit: TextLimit | None = None):
    import io

    stream = io.TextIOWrapper(open_input(path), encoding="utf-8")
    ids, texts, first, number = [], [], 0, 0
    for line in stream:
        if not line.strip():
            continue
        if number < skip:  # a row before skip: counted, not parsed
            number += 1
            first += 1
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--input {path}: line {number + 1} is not JSON ({exc})") from None
        if not isinstance(record, dict) or text_column not in record:
            raise InvalidInput(f"--input {path}: line {number + 1} has no {text_column!r} field")
        if id_column is not None and id_column not in record:
            raise InvalidInput(f"--input {path}: line {number + 1} has no {id_column!r} field")
        texts.append(record[text_column])
        ids.append(record[id_column] if id_column is not None else number)
        number += 1
        if len(texts) >= rows:
            _check_texts(texts, first, ids)
            _check_lengths(texts, first, ids, limit)
            yield first, ids, texts
            first, ids, texts = first + len(texts), [], []
    if texts:
        _check_texts(texts, first, ids)
        _check_lengths(texts, first, ids, limit)
        yield first, ids, texts


def output_schema(id_name: str, sample_id: Any, vectors, metadata: dict):
    """``id_name`` (the id column's type) and ``embedding``: a fixed-size list of the vectors' type."""
    pa = pyarrow()
    import numpy as np

    id_type = pa.array([sample_id]).type if sample_id is not None else pa.int64()
    if pa.types.is_null(id_type):
        id_type = pa.string()
    value_type = pa.from_numpy_dtype(np.asarray(vectors).dtype)
    width = int(np.asarray(vectors).shape[1])
    return pa.schema([pa.field(id_name, id_type), pa.field("embedding", pa.list_(value_type, width))],
                     metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()})


#: the vectors' bytes per row group of a part and of the output (a power of two of rows under it): what the
#: writer, and the merge reading a part, hold at a time. Whole parts in one row group (8192 rows of 384 float32:
#: 12 MiB per buffer, several buffers at a time) made the process's peak grow with the number of parts merged.
ROW_GROUP_BYTES = 2 << 20


def row_group_rows(schema) -> int:
    """Rows per row group for ``schema``'s vectors: the largest power of two whose vectors fit
    :data:`ROW_GROUP_BYTES` (at least 1; 1024 rows of 384 float32, 4096 of 384 int8)."""
    kind = schema.field("embedding").type
    row_bytes = max(1, kind.list_size * kind.value_type.bit_width // 8)
    rows = 1
    while rows * 2 * row_bytes <= ROW_GROUP_BYTES:
        rows *= 2
    return rows


def writer_options(schema) -> dict:
    """Parquet writer options for a part and the output: no dictionary and no min/max statistics for the
    vectors (neither helps float or quantized components, and the dictionary is tried per row group), the
    id column as pyarrow writes it by default."""
    id_name = schema.field(0).name
    return {"use_dictionary": [id_name], "write_statistics": [id_name]}


def table_of(schema, ids: list, vectors):
    pa = pyarrow()
    import numpy as np

    vectors = np.ascontiguousarray(vectors)
    flat = pa.array(vectors.reshape(-1), type=schema.field("embedding").type.value_type)
    column = pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])
    return pa.Table.from_arrays([pa.array(ids, type=schema.field(0).type), column], schema=schema)


def read_metadata(path: str) -> dict | None:
    """The job description an output file carries (None: not a Tessera output, or unreadable)."""
    pq = require("pyarrow.parquet", "bulk")
    try:
        schema = pq.read_schema(_random_access(path))
    except (OSError, ValueError):
        return None
    raw = (schema.metadata or {}).get(METADATA_KEY)
    return json.loads(raw) if raw else None
