"""The embedding cache (setting ``embedding_cache``): finished text embeddings, never computed twice.

A request's texts are looked up at once; only the texts not found (each distinct text once) go to the
model, as one request of their own, and what they give is stored. The key holds the served model's
identity (core/cache/identity.py: the bytes served, backend, dtype, the spec's vector options), every
request option that changes a vector (``REQUEST_FIELDS``: each field of ``EmbedRequest`` has a decision
here, and one without a decision makes nothing cacheable) and the text, so an entry never crosses models
or options; the value is the vector's float32 bytes as the model produced them (a hit answers the very
bytes the miss did) and the text's token count (``usage`` is the same either way), behind a header that
names the layout. Quantized types are made from the cached floats.

Every value read is checked before it is served (``check_value``: header, length, dimension, finiteness,
token count): a value that fails is a miss, counted in ``tessera_embedding_cache_bad_values``, and the
model's answer replaces it.

Cached: text inputs of the ``embed`` task with one vector per text (not token ids, media, late chunking,
multi-vector or sparse models). A store that fails (Redis down, timing out) is left alone for
``RETRY_S`` seconds: requests are served by the model meanwhile, with one warning and the
``tessera_embedding_cache_errors`` metric, never an error."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import logging
import struct
import time
import weakref
from typing import Any

import numpy as np

from core.cache.identity import KEY_VERSION, model_identity
from core.cache.stores import MemoryStore, RedisStore, Store, StoreUnavailable
from core.errors import InvalidInput, TooLarge
from core.request_context import note_cache

log = logging.getLogger("tessera.cache")

#: seconds a failed store is left alone before it is tried again
RETRY_S = 5.0
#: seconds between two warnings about bad values read from the store
BAD_VALUE_WARN_S = 60.0

# --- what each request field means for the cache ---------------------------------------------------------

#: the field is part of every entry's key
KEY = "key"
#: the field is the text itself (hashed into the key)
TEXT = "text"
#: a request whose field differs from ``EmbedRequest``'s default is never cached
DEFAULT_ONLY = "uncacheable unless default"
#: applied to the vectors after the cache (from the cached floats)
AFTER = "applied after the cache"
#: the field never changes a vector
NO_VECTOR = "does not change the vector"
#: the field selects the model, whose identity is in the key
MODEL = "selects the model"
#: the request is refused when the field is set
REFUSED = "refused"

#: every field of ``core.tasks.embed.EmbedRequest`` → its decision (tests/cache enumerates the dataclass:
#: a field added there without a decision here fails, and makes no request cacheable until it has one)
REQUEST_FIELDS: dict[str, str] = {
    "texts": TEXT,
    "token_ids": DEFAULT_ONLY,
    "truncate": KEY,
    "normalize": KEY,
    "dimensions": KEY,
    "modality": DEFAULT_ONLY,
    "inputs": DEFAULT_ONLY,
    "media": NO_VECTOR,  # the media fetcher: text requests have no media
    "prompt": KEY,
    "prompt_name": KEY,
    "input_type": KEY,
    "output": DEFAULT_ONLY,
    "truncation_direction": KEY,
    "chunking": KEY,
    "late_chunking": DEFAULT_ONLY,
    "task": KEY,
    "conversations": DEFAULT_ONLY,
}

#: EmbedRequest fields that change a text's vector (with the model's identity and the text)
VECTOR_OPTIONS = tuple(name for name, decision in REQUEST_FIELDS.items() if decision == KEY)

#: the wire schemas whose requests reach the cache (core/api/embeddings/schemas.py), field → the
#: ``EmbedRequest`` field(s) it becomes (their decision above applies) or a decision of its own
WIRE_FIELDS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "EmbeddingRequest": {
        "input": ("texts", "token_ids", "inputs"), "messages": "conversations",
        "add_generation_prompt": "conversations", "continue_final_message": "conversations", "model": MODEL,
        "encoding_format": AFTER, "dimensions": "dimensions", "user": NO_VECTOR, "normalize": "normalize",
        "truncate": "truncate", "modality": "modality", "prompt": "prompt", "prompt_name": "prompt_name",
        "embedding_type": AFTER, "input_type": "input_type", "chunking": "chunking",
        "late_chunking": "late_chunking", "task": "task",
    },
    "Chunking": {"size": "chunking", "overlap": "chunking"},
    "LateChunking": {"spans": "late_chunking", "separator": "late_chunking", "overlap": "late_chunking"},
    "TeiEmbedRequest": {
        "inputs": ("texts", "token_ids"), "normalize": "normalize", "truncate": "truncate",
        "truncation_direction": "truncation_direction", "prompt_name": "prompt_name", "dimensions": "dimensions",
    },
    "TeiEmbedAllRequest": {  # output "tokens": never cached
        "inputs": ("texts", "token_ids", "output"), "truncate": "truncate",
        "truncation_direction": "truncation_direction", "prompt_name": "prompt_name",
    },
    "TeiSimilarityInputs": {"source_sentence": "texts", "sentences": "texts"},
    "TeiSimilarityRequest": {
        "inputs": "texts", "truncate": "truncate", "truncation_direction": "truncation_direction",
        "prompt_name": "prompt_name",
    },
    "CohereEmbedRequest": {
        "model": MODEL, "texts": "texts", "images": ("modality", "inputs"), "input_type": "input_type",
        "embedding_types": AFTER, "truncate": ("truncate", "truncation_direction"), "output_dimension": "dimensions",
        "max_tokens": REFUSED,
    },
}


@functools.cache
def _request_defaults() -> dict[str, Any] | None:
    """``EmbedRequest``'s default per ``DEFAULT_ONLY`` field; None when a field has no decision (then no
    request is cached: an undecided field might change a vector)."""
    from core.tasks.embed import EmbedRequest

    fields = {f.name: f for f in dataclasses.fields(EmbedRequest)}
    if set(fields) != set(REQUEST_FIELDS):
        log.error("embedding cache off: EmbedRequest fields without a cache decision: %s",
                  sorted(set(fields) ^ set(REQUEST_FIELDS)))
        return None
    return {name: fields[name].default for name, decision in REQUEST_FIELDS.items() if decision == DEFAULT_ONLY}


def build_cache(settings: Any, metrics: Any = None) -> "EmbeddingCache | None":
    """The cache ``settings.embedding_cache`` asks for (None: off)."""
    kind = settings.embedding_cache
    if kind == "off":
        return None
    store: Store = MemoryStore(settings.embedding_cache_bytes) if kind == "memory" else RedisStore(kind)
    return EmbeddingCache(store, metrics)


def cacheable(engine: Any, request: Any) -> bool:
    """Whether ``request`` on ``engine`` goes through the cache: the ``embed`` task, one vector per text,
    every ``DEFAULT_ONLY`` field at its default, and a dimension the value can be checked against."""
    defaults = _request_defaults()
    if defaults is None or engine.task.name != "embed" or request.texts is None:
        return False
    if any(getattr(request, name) != default for name, default in defaults.items()):
        return False
    return expected_value(engine, request) is not None


def _option_value(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {"type": type(value).__name__, **dataclasses.asdict(value)}
    return value


# --- the value: a header, the token count and the float32 vector ------------------------------------------

#: magic, layout version (``KEY_VERSION``), element type, token count, dimension; then the vector
HEADER = struct.Struct("<2sBBII")
MAGIC = b"TE"
#: the element type code of little-endian float32
FLOAT32 = 1


class BadValue(ValueError):
    """A stored value that is not one this version wrote for this request (malformed, another layout,
    another dimension, non-finite, an impossible token count)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ExpectedValue:
    """What a request's values must hold: ``dimension`` floats, at most ``max_tokens`` tokens."""

    dimension: int
    max_tokens: int


def expected_value(engine: Any, request: Any) -> ExpectedValue | None:
    """The shape of ``request``'s values on ``engine`` (None: unknown, or a dimension the model refuses)."""
    from core.tasks.chunking import in_force

    task = engine.task
    full = getattr(task, "dimension", None)
    if not full or (request.dimensions is not None and not 0 < request.dimensions <= full):
        return None
    limit = task.limits.tokens
    max_length = getattr(task.info, "max_length", None)
    if max_length and in_force(task, request) is None:
        limit = min(limit, max_length)  # unchunked: one window at most
    return ExpectedValue(request.dimensions or full, limit)


def encode_value(vector: np.ndarray, tokens: int) -> bytes:
    vector = np.ascontiguousarray(vector, dtype="<f4").reshape(-1)
    return HEADER.pack(MAGIC, KEY_VERSION, FLOAT32, int(tokens), vector.size) + vector.tobytes()


def decode_value(value: bytes) -> tuple[np.ndarray, int]:
    """(vector, token count) of a stored value, its layout checked (any shape: ``check_value`` checks it
    against a request's); raises :class:`BadValue`."""
    if not isinstance(value, bytes):
        raise BadValue(f"a {type(value).__name__}, not bytes")
    if len(value) < HEADER.size:
        raise BadValue(f"{len(value)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, kind, tokens, dimension = HEADER.unpack_from(value)
    if magic != MAGIC or version != KEY_VERSION:
        raise BadValue(f"not a version-{KEY_VERSION} value (header {bytes(value[:4])!r})")
    if kind != FLOAT32:
        raise BadValue(f"element type {kind}, not float32")
    if len(value) != HEADER.size + 4 * dimension:
        raise BadValue(f"{len(value)} bytes for a header saying {dimension} floats")
    vector = np.frombuffer(value, dtype="<f4", offset=HEADER.size).astype(np.float32)
    if not np.isfinite(vector).all():
        raise BadValue("non-finite floats")
    return vector, tokens


def check_value(value: bytes, expected: ExpectedValue) -> tuple[np.ndarray, int]:
    """``decode_value``, and the vector's dimension and token count checked against ``expected``."""
    vector, tokens = decode_value(value)
    if vector.size != expected.dimension:
        raise BadValue(f"{vector.size} floats, the request's vectors have {expected.dimension}")
    if tokens > expected.max_tokens:
        raise BadValue(f"a token count of {tokens}, over the {expected.max_tokens} a text can have here")
    return vector, tokens


class EmbeddingCache:
    def __init__(self, store: Store, metrics: Any = None) -> None:
        self.store = store
        self.metrics = metrics
        #: engine → its identity's computation (weak: an engine rebuilt later is hashed again)
        self._identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._down_until = 0.0
        self._bad_warned_at = -BAD_VALUE_WARN_S
        self.hits = 0
        self.misses = 0
        self.errors = 0
        #: values read that failed their check (served as misses)
        self.bad_values = 0

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
        return (b"v%d\0" % KEY_VERSION + identity.encode() + json.dumps(options, sort_keys=True, default=str).encode()
                + b"\0")

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

    def _bad(self, model: str, exc: BadValue) -> None:
        self.bad_values += 1
        if self.metrics is not None:
            self.metrics.cache_bad_values.labels(model).inc()
        now = time.monotonic()
        if now - self._bad_warned_at >= BAD_VALUE_WARN_S:
            self._bad_warned_at = now
            log.warning("embedding cache (%s): a stored value for model %s is not one this server wrote (%s); "
                        "served as a miss and replaced", self.kind, model, exc)

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    async def _get(self, keys: list[bytes]) -> list[Any]:
        if not self.available:
            return [None] * len(keys)
        try:
            return await self.store.get_many(keys)
        except StoreUnavailable as exc:
            self._failed("get", exc)
            return [None] * len(keys)

    async def lookup(self, keys: list[bytes], model: str = "", expected: ExpectedValue | None = None
                     ) -> list[bytes | None]:
        """The stored values of ``keys`` (None: missing, or a value that fails its check, counted as bad;
        without ``expected`` only its layout is checked)."""
        out: list[bytes | None] = []
        for value in await self._get(keys):
            if value is not None:
                try:
                    if expected is None:
                        decode_value(value)
                    else:
                        check_value(value, expected)
                except BadValue as exc:
                    self._bad(model, exc)
                    value = None
            out.append(value)
        return out

    async def read(self, keys: list[bytes], model: str, expected: ExpectedValue) -> dict[bytes, tuple[np.ndarray, int]]:
        """The entries of ``keys`` that the store holds and that pass ``check_value`` (the rest are misses)."""
        entries = {}
        for key, value in zip(keys, await self._get(keys)):
            if value is None:
                continue
            try:
                entries[key] = check_value(value, expected)
            except BadValue as exc:
                self._bad(model, exc)
        return entries

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
        expected = expected_value(engine, request)
        if not texts or expected is None:
            return await engine(request, deadline=deadline)
        prefix = self.prefix(await self.identity(engine), request)
        keys = [self.key(prefix, t) for t in texts]
        distinct = list(dict.fromkeys(keys))
        entries = await self.read(distinct, engine.name, expected)
        first_text = dict(zip(reversed(keys), reversed(texts)))
        missing = [k for k in distinct if k not in entries]
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
                value = encode_value(vector, tokens)
                try:
                    check_value(value, expected)  # stored only what a read would serve
                except BadValue:
                    continue
                new[k] = value
            await self.save(new)
        self._count(engine.name, len(texts) - len(missing), len(missing))
        vectors = np.stack([entries[k][0] for k in keys])
        tokens = [entries[k][1] for k in keys]
        return EmbedResult(vectors, sum(tokens), tokens)

    async def close(self) -> None:
        await self.store.close()
