"""What the edge knows about the request in progress: its id, and what the engine did for it (model,
inputs, tokens) and why it was refused, for the access log line, the metrics and the trace.

One :class:`RequestRecord` per HTTP request, set by ``core.api.observability.Observability`` in a
context variable for the request's task; the engine and the error renderers add to it. Outside a
request (an in-process batch job) there is none and the notes cost one context-variable read."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    model: str | None = None
    inputs: int = 0
    tokens: int = 0
    #: the error code of the answer, when it was an error in the error shape
    error_code: str | None = None
    #: why the request was refused before any work, when the refusal says more than its code
    reason: str | None = None
    #: inputs answered by the embedding cache, and those it did not hold (None: the cache was not asked)
    cache_hits: int | None = None
    cache_misses: int | None = None


current: ContextVar[RequestRecord | None] = ContextVar("tessera_request", default=None)


def note_work(model: str, inputs: int, tokens: int) -> None:
    """An engine ran ``inputs`` items (``tokens`` tokens) of the current request on ``model``."""
    record = current.get()
    if record is not None:
        if record.model is None:
            record.model = model
        record.inputs += inputs
        record.tokens += tokens


def note_cache(hits: int, misses: int) -> None:
    """The embedding cache answered ``hits`` inputs of the current request and lacked ``misses``."""
    record = current.get()
    if record is not None:
        record.cache_hits = (record.cache_hits or 0) + hits
        record.cache_misses = (record.cache_misses or 0) + misses


def note_error(code: str) -> None:
    record = current.get()
    if record is not None:
        record.error_code = code


def note_rejection(reason: str) -> None:
    record = current.get()
    if record is not None:
        record.reason = reason


def request_id() -> str | None:
    record = current.get()
    return None if record is None else record.request_id
