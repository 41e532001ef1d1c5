"""The job's own store of the vectors it computed: an SQLite file in the job's work folder, so a text
seen earlier in the corpus (however far back) is never computed again, memory stays flat whatever the
corpus size, and a resumed job still knows what it computed before it was killed."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path
from typing import Sequence

from core.cache.stores import Store, StoreUnavailable

log = logging.getLogger("tessera.bulk")


class SqliteStore:
    kind = "job"

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # what the store holds in memory, whatever the corpus: a page cache of 2000 KiB (SQLite's default, set
        # here so it stays the bound), no memory-mapped pages; the keys and vectors themselves stay on disk
        self._db.execute("PRAGMA cache_size=-2000")
        self._db.execute("PRAGMA mmap_size=0")
        # a rowid table: a vector (1.5 KiB for 384 float32) fits its leaf page; in a WITHOUT ROWID table a row
        # over ~1 KB spills into an overflow page of its own (4.7 KB on disk per text against 2.1 KB here, and
        # inserts 6x slower). A work folder made with the earlier layout keeps it: the statements are the same.
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, value BLOB NOT NULL)")
        self._lock = threading.Lock()

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        found: dict[bytes, bytes] = {}
        with self._lock:
            for i in range(0, len(keys), 500):  # SQLite's bound-parameter limit
                part = list(keys[i:i + 500])
                marks = ",".join("?" * len(part))
                found.update(self._db.execute(f"SELECT key, value FROM vectors WHERE key IN ({marks})", part))
        return [found.get(k) for k in keys]

    async def set_many(self, items: dict[bytes, bytes]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            # a value written again replaces the stored one: a bad value copied in from the shared store, which the
            # cache's checks refused and had computed again, is not read (and computed) a second time
            self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", items.items())
            self._db.execute("COMMIT")

    async def close(self) -> None:
        with self._lock:
            self._db.close()


class TieredStore:
    """The job's store first, then a shared one (the ``embedding_cache`` setting): what the shared cache
    holds is copied into the job's; new vectors go to both. A failing shared store is the cache's to report."""

    def __init__(self, local: Store, shared: Store) -> None:
        self.local, self.shared = local, shared
        self.kind = f"{local.kind}+{shared.kind}"
        self.shared_hits = 0
        self.shared_down = False

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        found = await self.local.get_many(keys)
        missing = [k for k, v in zip(keys, found) if v is None]
        if missing and not self.shared_down:
            try:
                shared = dict(zip(missing, await self.shared.get_many(missing)))
            except StoreUnavailable as exc:
                self._down(exc)
                return found
            copied = {k: v for k, v in shared.items() if v is not None}
            if copied:
                self.shared_hits += len(copied)
                await self.local.set_many(copied)
            found = [v if v is not None else shared.get(k) for k, v in zip(keys, found)]
        return found

    async def set_many(self, items: dict[bytes, bytes]) -> None:
        await self.local.set_many(items)
        if not self.shared_down:
            try:
                await self.shared.set_many(items)
            except StoreUnavailable as exc:
                self._down(exc)

    def _down(self, exc: StoreUnavailable) -> None:
        log.warning("the shared embedding cache (%s) failed: %s; the job goes on with its own store", self.shared.kind,
                    exc)
        self.shared_down = True  # the rest of the job runs on its own store

    async def close(self) -> None:
        await self.local.close()
        await self.shared.close()
