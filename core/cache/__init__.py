"""The embedding cache (setting ``embedding_cache``): finished text embeddings, never computed twice.

A request's texts are looked up at once; only the texts not found (each distinct text once) go to the
model, as one request of their own, and what they give is stored. The key holds the served model's
identity (core/cache/identity.py: the bytes served, backend, dtype, the spec's vector options), every
request option that changes a vector (normalize, dimensions, prompt, prompt name, input type, truncation,
its direction, chunking) and the text, so an entry never crosses models or options; the value is the
vector's float32 bytes as the model produced them (a hit answers the very bytes the miss did) and the
text's token count (``usage`` is the same either way). Quantized types are made from the cached floats.

Cached: text inputs of the ``embed`` task with one vector per text (not token ids, media, late chunking,
multi-vector or sparse models). A store that fails (Redis down, timing out) is left alone for
``RETRY_S`` seconds: requests are served by the model meanwhile, with one warning and the
``tessera_embedding_cache_errors`` metric, never an error."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
import weakref
from typing import Any

import numpy as np

from core.cache.identity import model_identity
from core.cache.stores import MemoryStore, RedisStore, Store, StoreUnavailable
from core.errors import InvalidInput, TooLarge
from core.request_context import note_cache

log = logging.getLogger("tessera.cache")

#: seconds a failed store is left alone before it is tried again
RETRY_S = 5.0

#: EmbedRequest fields that change a text's vector (with the model's identity and the text)
VECTOR_OPTIONS = ("truncate", "normalize", "dimensions", "prompt", "prompt_name", "input_type",
                  "truncation_direction", "chunking")


def build_cache(settings: Any, metrics: Any = None) -> "EmbeddingCache | None":
    """The cache ``settings.embedding_cache`` asks for (None: off)."""
    kind = settings.embedding_cache
    if kind == "off":
        return None
    store: Store = MemoryStore(settings.embedding_cache_bytes) if kind == "memory" else RedisStore(kind)
    return EmbeddingCache(store, metrics)


def cacheable(engine: Any, request: Any) -> bool:
    return (engine.task.name == "embed" and request.modality == "text" and request.texts is not None
            and request.token_ids is None and request.output == "pooled" and request.late_chunking is None)


def _option_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {"type": type(value).__name__, **dataclasses.asdict(value)}
    return value


def encode_value(vector: np.ndarray, tokens: int) -> bytes:
    return int(tokens).to_bytes(4, "little") + np.ascontiguousarray(vector, dtype="<f4").tobytes()


def decode_value(value: bytes) -> tuple[np.ndarray, int]:
    return np.frombuffer(value, dtype="<f4", offset=4).astype(np.float32), int.from_bytes(value[:4], "little")


class EmbeddingCache:
    def __init__(self, store: Store, metrics: Any = None) -> None:
        self.store = store
        self.metrics = metrics
        #: engine → its identity's computation (weak: an engine rebuilt later is hashed again)
        self._identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._down_until = 0.0
        self.hits = 0
        self.misses = 0
        self.errors = 0

    @property
    def kind(self) -> str:
        return self.store.kind

    async def identity(self, engine: Any) -> str:
        """The engine's model identity, computed once (its files hashed in a worker thread)."""
        known = self._identities.get(engine)
        if known is None:
            known = asyncio.ensure_future(asyncio.to_thread(model_identity, engine))
            self._identities[engine] = known
        try:
            return await asyncio.shield(known)
        except BaseException:
            if known.done():
                self._identities.pop(engine, None)
            raise

    def prefix(self, identity: str, request: Any) -> bytes:
        options = {name: _option_value(getattr(request, name)) for name in VECTOR_OPTIONS}
        return identity.encode() + json.dumps(options, sort_keys=True, default=str).encode() + b"\0"

    @staticmethod
    def key(prefix: bytes, text: str) -> bytes:
        return hashlib.blake2b(prefix + text.encode("utf-8", "surrogatepass"), digest_size=20).digest()

    def _count(self, model: str, hits: int, misses: int) -> None:
        self.hits += hits
        self.misses += misses
        note_cache(hits, misses)
        metrics = self.metrics
        if metrics is not None and metrics.recording:
            metrics.cache_hits.labels(model).inc(hits)
            metrics.cache_misses.labels(model).inc(misses)

    def _failed(self, op: str, exc: StoreUnavailable) -> None:
        self.errors += 1
        if self.metrics is not None:
            self.metrics.cache_errors.labels(op).inc()
        if time.monotonic() >= self._down_until:
            log.warning("embedding cache (%s) unavailable on %s: %s; serving without it for %.0fs",
                        self.kind, op, exc, RETRY_S)
        self._down_until = time.monotonic() + RETRY_S

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    async def lookup(self, keys: list[bytes]) -> list[bytes | None]:
        if not self.available:
            return [None] * len(keys)
        try:
            return await self.store.get_many(keys)
        except StoreUnavailable as exc:
            self._failed("get", exc)
            return [None] * len(keys)

    async def save(self, items: dict[bytes, bytes]) -> None:
        if not items or not self.available:
            return
        try:
            await self.store.set_many(items)
        except StoreUnavailable as exc:
            self._failed("set", exc)

    async def embed(self, engine: Any, request: Any, *, deadline: float | None) -> Any:
        """``engine(request)`` through the cache: the same result (vectors in order, usage), the misses run."""
        from core.tasks.embed import EmbedResult

        texts = list(request.texts)
        if not texts:
            return await engine(request, deadline=deadline)
        prefix = self.prefix(await self.identity(engine), request)
        keys = [self.key(prefix, t) for t in texts]
        distinct = list(dict.fromkeys(keys))
        found = dict(zip(distinct, await self.lookup(distinct)))
        first_text = dict(zip(reversed(keys), reversed(texts)))
        missing = [k for k in distinct if found[k] is None]
        entries: dict[bytes, tuple[np.ndarray, int]] = {k: decode_value(v) for k, v in found.items() if v is not None}
        if missing:
            sub = dataclasses.replace(request, texts=[first_text[k] for k in missing])
            try:
                result = await engine(sub, deadline=deadline)
            except (InvalidInput, TooLarge):
                # a refused input: the whole request again, uncached, so the error names it as the caller sent it
                return await engine(request, deadline=deadline)
            if result.input_tokens is None or not isinstance(result.vectors, np.ndarray):
                return await engine(request, deadline=deadline)
            new = {}
            for k, vector, tokens in zip(missing, result.vectors, result.input_tokens):
                entries[k] = (vector, tokens)
                new[k] = encode_value(vector, tokens)
            await self.save(new)
        self._count(engine.name, len(texts) - len(missing), len(missing))
        vectors = np.stack([entries[k][0] for k in keys])
        tokens = [entries[k][1] for k in keys]
        return EmbedResult(vectors, sum(tokens), tokens)

    async def close(self) -> None:
        await self.store.close()
