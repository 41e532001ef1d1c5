"""Where cached embeddings live: this process's memory (LRU, bounded in bytes) or a Redis server.

A store maps a key (bytes) to a value (bytes). ``get_many``/``set_many`` take a request's keys at once
(one Redis round trip each). A store that cannot answer raises :class:`StoreUnavailable`; the cache
(core/cache/__init__.py) then serves without it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol, Sequence

from core.cache.identity import KEY_VERSION
from core.errors import require

#: bytes an entry costs beyond its key and value (the dict slot, the bytes objects' headers)
ENTRY_OVERHEAD = 120


class StoreUnavailable(Exception):
    """The store could not be read or written (connection refused, timeout, a server error)."""


class Store(Protocol):
    kind: str

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]: ...

    async def set_many(self, items: dict[bytes, bytes]) -> None: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Least recently used entries go first once ``max_bytes`` (keys, values and overhead) is reached."""

    kind = "memory"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()
        self._lock = threading.Lock()  # the job's threads may share one store with the loop

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _size(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._lock:
            for key in keys:
                value = self._entries.get(key)
                if value is not None:
                    self._entries.move_to_end(key)
                out.append(value)
        return out

    async def set_many(self, items: dict[bytes, bytes]) -> None:
        with self._lock:
            for key, value in items.items():
                size = self._size(key, value)
                if size > self.max_bytes:
                    continue
                old = self._entries.pop(key, None)
                if old is not None:
                    self.bytes -= self._size(key, old)
                self._entries[key] = value
                self.bytes += size
            while self.bytes > self.max_bytes and self._entries:
                key, value = self._entries.popitem(last=False)
                self.bytes -= self._size(key, value)

    async def close(self) -> None:
        return None


#: seconds a Redis command (or connecting) may take before the request goes on without the cache
REDIS_TIMEOUT_S = 0.5


class RedisStore:
    """One Redis (or anything speaking its protocol) shared by every replica: ``MGET`` for a request's keys,
    one pipelined ``SET`` per new entry. Entries never expire here: give the server a ``maxmemory`` and the
    ``allkeys-lru`` policy (docs/configuration.md). The client connects on first use, in the event loop
    that uses it. Keys carry the layout version (``KEY_VERSION``): another version's keys are never read."""

    kind = "redis"
    PREFIX = b"tessera:emb:v%d:" % KEY_VERSION

    def __init__(self, url: str, timeout_s: float = REDIS_TIMEOUT_S) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._client = None
        self._errors: tuple[type[BaseException], ...] = ()

    def _connection(self):
        if self._client is None:
            redis = require("redis.asyncio", "redis")
            exceptions = require("redis.exceptions", "redis")
            self._errors = (exceptions.RedisError, OSError, TimeoutError)
            self._client = redis.Redis.from_url(
                self.url, socket_timeout=self._timeout_s, socket_connect_timeout=self._timeout_s,
                retry_on_timeout=False, health_check_interval=30)
        return self._client

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        client = self._connection()
        try:
            return list(await client.mget([self.PREFIX + k for k in keys]))
        except self._errors as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def set_many(self, items: dict[bytes, bytes]) -> None:
        client = self._connection()
        try:
            async with client.pipeline(transaction=False) as pipe:
                for key, value in items.items():
                    pipe.set(self.PREFIX + key, value)
                await pipe.execute()
        except self._errors as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._client is not None:
            try:
                await self._client.aclose()
            except self._errors:
                pass
            self._client = None
