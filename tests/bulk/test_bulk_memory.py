"""The job's memory does not grow with the corpus: the merge of the parts into the output holds one row group
at a time however many parts there are, and parts and output are written in bounded row groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq

from core.bulk import formats
from core.bulk.job import done_parts, merge_parts, write_part
from tests.support.server import ROOT

WIDTH = 384  # all-MiniLM-L6-v2's float32 vectors: 1.5 KiB a row
PART_ROWS = 8192  # the job's default --rows-per-part

# Run in a fresh process: its peak RSS before the merge and after it, pyarrow's pool peak. The process's own
# VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak (the kernel keeps the larger across exec).
MERGE_PROBE = """
import json, sys
from pathlib import Path
import pyarrow as pa
import pyarrow.parquet as pq
from core.bulk.job import done_parts, merge_parts

def peak_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:"))

pq.read_schema(done_parts(Path(sys.argv[1]))[0][2])  # pyarrow's modules loaded before "before"
before = peak_mb()
rows = merge_parts(Path(sys.argv[1]), sys.argv[2], {"job": {}, "model": {}})
print(json.dumps({"rows": rows, "before": before, "peak": peak_mb(),
                  "pool_peak": pa.default_memory_pool().max_memory() / 2**20}))
"""


def write_parts(work, parts: int, rows: int = PART_ROWS, seed: int = 0) -> None:
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(parts):
        start = i * rows
        write_part(work, start, list(range(start, start + rows)), rng.standard_normal((rows, WIDTH), np.float32),
                   {"model": {}, "options": {}}, "id")


def merge_in_a_fresh_process(work, output) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", MERGE_PROBE, str(work), str(output)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_merges_peak_memory_does_not_grow_with_the_number_of_parts(tmp_path):
    """2 parts against 40 (16,384 against 327,680 rows of 384 float32): the memory the merge adds to its
    process's peak is the same, and small. With whole parts as row groups (12 MiB buffers, a dictionary
    tried on the floats, decoded on pyarrow's thread pool) the merge added 156-160 MB for 2 parts and 18-36
    MB more for 40 (pyarrow's pool peaked at 87 MiB either way): the step of the job whose peak grew with the
    corpus. Now 42 MB for both, the pool at 13 MiB."""
    added = {}
    for parts in (2, 40):
        write_parts(tmp_path / f"w{parts}", parts)
        probe = merge_in_a_fresh_process(tmp_path / f"w{parts}", tmp_path / f"out{parts}.parquet")
        assert probe["rows"] == parts * PART_ROWS
        added[parts] = probe["peak"] - probe["before"]
        # a few row groups of 2 MiB of vectors in flight (read, carried, written), not parts of 12 MiB
        assert probe["pool_peak"] < 8 * formats.ROW_GROUP_BYTES / 2**20, probe
    assert added[40] - added[2] < 5, added  # MB
    assert added[40] < 80, added


def test_parts_and_output_are_written_in_bounded_row_groups_carried_across_parts(tmp_path):
    """Parts of 700 rows (not a multiple of the row group) merge into row groups of row_group_rows rows
    (the last one shorter), the ids in order, every one once."""
    work = tmp_path / "work"
    write_parts(work, 5, rows=700)
    output = tmp_path / "out.parquet"
    assert merge_parts(work, str(output), {"job": {"x": 1}, "model": {}}) == 3500
    schema = pq.read_schema(done_parts(work)[0][2])
    group = formats.row_group_rows(schema)
    assert group == 1024  # 1024 rows of 384 float32 = 1.5 MiB <= ROW_GROUP_BYTES < 2048 rows
    for _, _, path in done_parts(work):
        meta = pq.ParquetFile(path).metadata
        assert max(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) <= group
    meta = pq.ParquetFile(output).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [1024, 1024, 1024, 428]
    table = pq.read_table(output)
    assert table.column("id").to_pylist() == list(range(3500))
    assert json.loads(table.schema.metadata[formats.METADATA_KEY])["rows"] == 3500
    # the vectors have no dictionary encoding and no min/max statistics; the ids keep theirs
    column = meta.row_group(0).column(1)
    assert "RLE_DICTIONARY" not in column.encodings and "PLAIN_DICTIONARY" not in column.encodings
    assert not column.is_stats_set and meta.row_group(0).column(0).is_stats_set


def test_row_groups_hold_at_most_row_group_bytes_of_vectors_for_each_vector_type():
    import pyarrow as pa

    for value_type, width, rows in [(pa.float32(), 384, 1024), (pa.float32(), 1024, 512), (pa.int8(), 384, 4096),
                                    (pa.uint8(), 48, 32768), (pa.float32(), 100_000, 4), (pa.float32(), 2**20, 1)]:
        schema = pa.schema([pa.field("id", pa.int64()), pa.field("embedding", pa.list_(value_type, width))])
        assert formats.row_group_rows(schema) == rows, (value_type, width)


def test_the_job_store_keeps_a_bounded_page_cache_and_about_a_vectors_bytes_on_disk_per_text(tmp_path):
    """The repeats store (an SQLite file in the work folder) holds 2000 KiB of pages in memory whatever the
    corpus, and about one vector's bytes per text on disk (a WITHOUT ROWID table spilled each 1.5 KiB row into
    an overflow page: 4.7 KB a text)."""
    import asyncio
    import hashlib
    import sqlite3

    from core.bulk.store import SqliteStore
    from core.cache import encode_value

    path = tmp_path / "vectors.sqlite"
    store = SqliteStore(path)
    value = encode_value(np.random.default_rng(0).standard_normal(WIDTH, np.float32), 13)  # 1548 bytes
    rows = 8192
    for batch in range(4):
        keys = [hashlib.blake2b(f"{batch}-{i}".encode(), digest_size=20).digest() for i in range(rows // 4)]
        asyncio.run(store.set_many({k: value for k in keys}))
    assert asyncio.run(store.get_many([keys[0], b"absent"])) == [value, None]
    assert store._db.execute("PRAGMA cache_size").fetchone()[0] == -2000
    assert store._db.execute("PRAGMA mmap_size").fetchone()[0] == 0
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    asyncio.run(store.close())
    per_text = path.stat().st_size / rows
    assert len(value) < per_text < 1.5 * len(value), per_text

    # a work folder made with the earlier layout resumes on it
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as db:
        db.execute("CREATE TABLE vectors (key BLOB PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID")
        db.execute("INSERT INTO vectors VALUES (?, ?)", (b"k1", b"v1"))
    store = SqliteStore(old)
    assert asyncio.run(store.get_many([b"k1"])) == [b"v1"]
    # a value written again replaces the stored one (a bad copy from a shared store is not read twice)
    asyncio.run(store.set_many({b"k1": b"other", b"k2": b"v2"}))
    assert asyncio.run(store.get_many([b"k1", b"k2"])) == [b"other", b"v2"]
    asyncio.run(store.close())
