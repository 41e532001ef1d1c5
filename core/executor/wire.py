"""What crosses between a front end and an executor.

Control messages are frames on a Unix domain socket: an 8-byte prefix (header length, payload length), a
small JSON header (orjson) and an optional payload. The bulk of a request — its items' token arrays — and of
an answer — its results — lies in a shared-memory arena (``core.executor.shm``) at the offset the header
names; the payload carries them only when the arena has no room (an unusually large request or answer).

Items and results are encoded by column, never pickled per item:

- **items** (``encode_items`` / ``decode_items``): the items of one request are one dataclass (``Encoded``,
  the chunking windows, ``TokenItem``, ``M3Item`` …); each of its array fields becomes one lengths column and
  one concatenated data array, each scalar field one array (or one value in the header when every item has
  the same), so the executor rebuilds each item as numpy views over the arena. Fields only ``finish`` reads
  (``FRONT_END_ONLY``) stay in the front end.
- **results** (``encode_results`` / ``decode_results``): a column of arrays (stacked when they share a shape:
  pooled vectors, logits; ragged otherwise: per-token vectors), of floats (scores), or of dataclasses
  (``SparseVector``, ``M3Output``) field by field, with a mask for the values that are None.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import itertools
import struct
from typing import Any, Sequence

import numpy as np
import orjson

from core.errors import BackendFailure

PREFIX = struct.Struct("<II")
#: item fields read by ``Task.finish`` alone, never by collate/postprocess: not sent to the executor
FRONT_END_ONLY = frozenset({"chunks"})
_ALIGN = 8


# ---- frames -------------------------------------------------------------------------------------------
async def read_frame(reader: asyncio.StreamReader) -> tuple[dict, bytes | None]:
    head = await reader.readexactly(PREFIX.size)
    hlen, plen = PREFIX.unpack(head)
    header = orjson.loads(await reader.readexactly(hlen))
    payload = await reader.readexactly(plen) if plen else None
    return header, payload


def frame(header: dict, payload: bytes | memoryview | None = None) -> list:
    body = orjson.dumps(header)
    parts = [PREFIX.pack(len(body), len(payload) if payload is not None else 0), body]
    if payload is not None:
        parts.append(payload)
    return parts


def write_frame(writer: asyncio.StreamWriter, header: dict, payload: bytes | memoryview | None = None) -> None:
    writer.writelines(frame(header, payload))


class Outbox:
    """Frames queued during one turn of the event loop go out in one write (one system call for the replies
    of a whole batch, or for the requests several callers sent at once)."""

    def __init__(self, writer: asyncio.StreamWriter, before_flush=None):
        self.writer = writer
        #: the connection's loop, looked up once (on Python 3.11 each lookup is a getpid() system call)
        self.loop = asyncio.get_running_loop()
        self.parts: list = []
        self.scheduled = False
        #: called first at each flush (the front end adds the result blocks to free)
        self.before_flush = before_flush

    def send(self, header: dict, payload: bytes | memoryview | None = None) -> None:
        self.parts += frame(header, payload)
        self.schedule()

    def schedule(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if self.before_flush is not None:
            self.before_flush()
        if self.parts and not self.writer.is_closing():
            parts, self.parts = self.parts, []
            self.writer.write(b"".join(parts))
        else:
            self.parts = []


# ---- classes ------------------------------------------------------------------------------------------
_CLASSES: dict[str, type] = {}


def class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_class(name: str) -> type:
    """The dataclass named ``module:qualname`` (only Tessera's own: ``core.…``)."""
    cls = _CLASSES.get(name)
    if cls is None:
        module, _, qualname = name.partition(":")
        if not module.startswith("core.") or "." in qualname:
            raise BackendFailure(f"internal: the executor protocol names an unknown class {name!r}")
        cls = getattr(importlib.import_module(module), qualname)
        if not dataclasses.is_dataclass(cls):
            raise BackendFailure(f"internal: {name!r} is not a dataclass")
        _CLASSES[name] = cls
    return cls


# ---- layout of arrays in a block ----------------------------------------------------------------------
def padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


class _Writer:
    """Arrays to be written one after another (each aligned) into one block; their table goes in the header."""

    def __init__(self) -> None:
        self.parts: list[np.ndarray | list[np.ndarray]] = []
        self.table: list[list] = []  # [dtype, count] per array
        self.nbytes = 0

    def add(self, array: np.ndarray) -> None:
        self.parts.append(array)
        self.table.append([array.dtype.str, int(array.size)])
        self.nbytes += padded(array.nbytes)

    def add_concat(self, arrays: Sequence[np.ndarray], dtype: np.dtype, count: int) -> None:
        """The concatenation of ``arrays`` (written straight into the block, not built first)."""
        self.parts.append(list(arrays))
        self.table.append([np.dtype(dtype).str, int(count)])
        self.nbytes += padded(count * np.dtype(dtype).itemsize)

    def write(self, buf, offset: int) -> None:
        pos = offset
        for part, (dtype, count) in zip(self.parts, self.table):
            dt = np.dtype(dtype)
            out = np.frombuffer(buf, dt, count, pos)
            if isinstance(part, list):
                if len(part) == 1:
                    out[:] = part[0].reshape(-1)
                elif part:
                    if part[0].ndim != 1 or part[-1].ndim != 1:
                        part = [p.reshape(-1) for p in part]
                    np.concatenate(part, out=out, casting="same_kind")
            else:
                out[:] = part.reshape(-1)
            pos += padded(count * dt.itemsize)


class _Reader:
    def __init__(self, buf, offset: int, table: list[list]):
        self.buf, self.pos, self.table, self.next = buf, offset, table, 0

    def take(self) -> np.ndarray:
        dtype, count = self.table[self.next]
        self.next += 1
        dt = np.dtype(dtype)
        array = np.frombuffer(self.buf, dt, count, self.pos)
        self.pos += padded(count * dt.itemsize)
        return array


# ---- items --------------------------------------------------------------------------------------------
_PLANS: dict[type, tuple[str, list[str]]] = {}


def _plan(cls: type) -> tuple[str, list[str]]:
    """A class's name and the fields that cross, in order (the front-end-only ones must be its last)."""
    plan = _PLANS.get(cls)
    if plan is None:
        names = [f.name for f in dataclasses.fields(cls)]
        sent = [n for n in names if n not in FRONT_END_ONLY]
        if names[:len(sent)] != sent:  # the executor builds items positionally from the fields that cross
            raise BackendFailure(f"internal: {class_name(cls)}'s front-end-only fields must come last")
        plan = _PLANS[cls] = (class_name(cls), sent)
    return plan


def encode_items(items: Sequence[Any]) -> tuple[dict, _Writer, list[int]]:
    """The header part describing ``items`` (one dataclass), the arrays to write, and the items' costs."""
    cls = type(items[0])
    n = len(items)
    for item in items:
        if type(item) is not cls:
            raise BackendFailure(f"internal: a request's items mix {class_name(cls)} and {class_name(type(item))}")
    name_of_class, fields = _plan(cls)
    writer = _Writer()
    columns = []
    shared: list[int] | None = None
    for name in fields:
        values = [getattr(it, name) for it in items]
        first = values[0]
        if isinstance(first, np.ndarray):
            lengths = [v.size for v in values]
            if shared is None:
                shared = lengths
                writer.add(np.array(lengths, dtype=np.int64))
                columns.append([name, "a", first.dtype.str, 0])
            elif lengths == shared:
                columns.append([name, "a", first.dtype.str, -1])  # the lengths of the first array column
            else:
                writer.add(np.array(lengths, dtype=np.int64))
                columns.append([name, "a", first.dtype.str, 0])
            writer.add_concat(values, first.dtype, sum(lengths))
        elif first is None or isinstance(first, (bool, int, float, str, np.integer, np.floating, np.bool_)):
            if n == 1 or all(v == first for v in values):
                columns.append([name, "c", first.item() if isinstance(first, np.generic) else first])
            elif isinstance(first, str):
                vocab = sorted(set(values))
                index = {v: i for i, v in enumerate(vocab)}
                writer.add(np.array([index[v] for v in values], dtype=np.int32))
                columns.append([name, "s", vocab])
            elif isinstance(first, (bool, np.bool_)):
                writer.add(np.array(values, dtype=np.bool_))
                columns.append([name, "b"])
            elif isinstance(first, (int, np.integer)):
                writer.add(np.array(values, dtype=np.int64))
                columns.append([name, "i"])
            elif isinstance(first, (float, np.floating)):
                writer.add(np.array(values, dtype=np.float64))
                columns.append([name, "f"])
            else:
                raise BackendFailure(f"internal: item field {name!r} holds values of several kinds")
        else:
            raise BackendFailure(f"internal: item field {class_name(cls)}.{name} ({type(first).__name__}) has no "
                                 "encoding for the executor")
    return {"cls": name_of_class, "n": n, "cols": columns}, writer, [it.cost for it in items]


def decode_items(layout: dict, table: list[list], buf, offset: int) -> list[Any]:
    """The items as views over ``buf`` (the arena, or a frame's payload)."""
    cls = resolve_class(layout["cls"])
    n = layout["n"]
    reader = _Reader(buf, offset, table)
    columns: list = []
    shared_bounds = None
    for column in layout["cols"]:
        kind = column[1]
        if kind == "a":
            if column[3] == -1:
                bounds = shared_bounds
            else:
                bounds = [0, *itertools.accumulate(reader.take().tolist())]
                if shared_bounds is None:
                    shared_bounds = bounds
            data = reader.take()
            columns.append([data[bounds[i]:bounds[i + 1]] for i in range(n)])
        elif kind == "c":
            columns.append(itertools.repeat(column[2], n))
        elif kind == "s":
            vocab = column[2]
            columns.append([vocab[i] for i in reader.take().tolist()])
        else:  # b, i, f
            columns.append(reader.take().tolist())
    # the fields that cross come first in the class (those left in the front end are trailing): positional
    return [cls(*row) for row in zip(*columns)]


# ---- results ------------------------------------------------------------------------------------------
def _encode_column(values: list, writer: _Writer) -> list:
    n = len(values)
    if n == 0:
        return ["E"]
    nones = [v is None for v in values]
    if any(nones):
        if all(nones):
            return ["Z"]
        writer.add(np.asarray(nones, dtype=np.bool_))
        return ["N", _encode_column([v for v in values if v is not None], writer)]
    first = values[0]
    if isinstance(first, np.ndarray):
        dtype, shape = first.dtype, first.shape
        if all(v.shape == shape and v.dtype == dtype for v in values):
            writer.add_concat(values, dtype, n * first.size)
            return ["A", list(shape)]
        ndim = first.ndim
        if any(v.ndim != ndim for v in values):
            raise BackendFailure("internal: a result column mixes arrays of different ranks")
        dtype = np.result_type(*values)
        writer.add(np.asarray([v.shape for v in values], dtype=np.int64).reshape(-1))
        writer.add_concat(values, dtype, sum(v.size for v in values))
        return ["R", ndim]
    if isinstance(first, (bool, np.bool_)):
        writer.add(np.asarray(values, dtype=np.bool_))
        return ["B"]
    if isinstance(first, (int, np.integer)) and all(isinstance(v, (int, np.integer)) for v in values):
        writer.add(np.asarray(values, dtype=np.int64))
        return ["I"]
    if isinstance(first, (float, int, np.floating, np.integer)):
        writer.add(np.asarray(values, dtype=np.float64))
        return ["F"]
    if dataclasses.is_dataclass(first):
        cls = type(first)
        if any(type(v) is not cls for v in values):
            raise BackendFailure(f"internal: a result column mixes {class_name(cls)} with other kinds")
        fields = [f.name for f in dataclasses.fields(cls)]
        return ["D", class_name(cls), [[name, _encode_column([getattr(v, name) for v in values], writer)]
                                       for name in fields]]
    raise BackendFailure(f"internal: a result of kind {type(first).__name__} has no encoding for the front end")


def encode_results(results: list) -> tuple[list, _Writer]:
    writer = _Writer()
    return _encode_column(list(results), writer), writer


def _decode_column(desc: list, n: int, reader: _Reader) -> list:
    kind = desc[0]
    if kind == "E":
        return []
    if kind == "Z":
        return [None] * n
    if kind == "N":
        mask = reader.take()
        present = iter(_decode_column(desc[1], int(n - mask.sum()), reader))
        return [None if m else next(present) for m in mask.tolist()]
    if kind == "A":
        shape = desc[1]
        return list(reader.take().reshape(n, *shape))
    if kind == "R":
        ndim = desc[1]
        shapes = reader.take().reshape(n, ndim).tolist()
        data = reader.take()
        out, pos = [], 0
        for shape in shapes:
            size = int(np.prod(shape)) if shape else 1
            out.append(data[pos:pos + size].reshape(shape))
            pos += size
        return out
    if kind == "F":
        return reader.take().tolist()
    if kind == "I":
        return reader.take().tolist()
    if kind == "B":
        return reader.take().tolist()
    if kind == "D":
        cls = resolve_class(desc[1])
        columns = {name: _decode_column(sub, n, reader) for name, sub in desc[2]}
        names = list(columns)
        return [cls(**dict(zip(names, row))) for row in zip(*columns.values())]
    raise BackendFailure(f"internal: unknown result encoding {kind!r}")


def decode_results(desc: list, n: int, table: list[list], buf, offset: int) -> list:
    return _decode_column(desc, n, _Reader(buf, offset, table))
