"""A lone small request is tokenized on the event loop (no thread hop); larger ones on the preparing
thread. Both paths give the vectors of the in-process reference (``Engine.run_sync``)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.tasks.base import INLINE_PREPARE_CHARS
from core.tasks.embed import EmbedRequest

SHORT = ["a lone short query", "and a second one"]
LONG = [("a longer passage about serving embeddings on small machines " * 4).strip()] * 8


@pytest.fixture  # per test: stopping an engine closes its threads
def engine(minilm_dir) -> Engine:
    return Engine.load(ModelSpec(path=minilm_dir, backend="torch"), Settings(threads=2, models=[]))


def _served(engine: Engine, request: EmbedRequest, monkeypatch) -> tuple[np.ndarray, list[threading.Thread]]:
    """The vectors the engine serves for ``request``, and the threads its texts were tokenized on."""
    threads = []
    tokenizer = engine.task.tokenizer
    real = tokenizer.encode

    def spy(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", spy)
    loop = asyncio.new_event_loop()

    async def go():
        await engine.start()
        try:
            return await engine(request)
        finally:
            await engine.stop()

    try:
        result = loop.run_until_complete(go())
    finally:
        loop.close()
    assert threads, "the request's texts were never tokenized"
    return np.asarray(result.vectors), threads


def _off_loop(threads: list[threading.Thread]) -> bool:
    """Tokenized off the event loop's thread (on a preparing thread)."""
    return any(t is not threading.main_thread() for t in threads)


def test_a_small_request_is_prepared_on_the_loop_with_the_reference_vectors(engine, monkeypatch):
    assert sum(map(len, SHORT)) <= INLINE_PREPARE_CHARS
    vectors, threads = _served(engine, EmbedRequest(texts=SHORT), monkeypatch)
    assert not _off_loop(threads)
    np.testing.assert_allclose(vectors, np.asarray(engine.run_sync(EmbedRequest(texts=SHORT)).vectors), atol=1e-6)


def test_a_large_request_is_prepared_off_the_loop_with_the_reference_vectors(engine, monkeypatch):
    assert sum(map(len, LONG)) > INLINE_PREPARE_CHARS
    vectors, threads = _served(engine, EmbedRequest(texts=LONG), monkeypatch)
    assert _off_loop(threads)
    np.testing.assert_allclose(vectors, np.asarray(engine.run_sync(EmbedRequest(texts=LONG)).vectors), atol=1e-6)


def test_the_engine_tokenizes_on_the_settings_number_of_threads(engine, monkeypatch):
    """``Settings(threads=2)``: one tokenizing thread by default (``tokenizing_threads``); a large request
    runs on it."""
    assert engine._prep._workers == Settings(threads=2, models=[]).tokenizing_threads == 1
    _, threads = _served(engine, EmbedRequest(texts=LONG), monkeypatch)
    assert threads and all(t.name == f"prep-{engine.name}_0" for t in threads)
