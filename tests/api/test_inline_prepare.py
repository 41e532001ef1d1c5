"""A lone small request is tokenized on the event loop (no thread hop); larger ones on the preparing
thread. Both paths give the vectors of the in-process reference (``Engine.run_sync``)."""

from __future__ import annotations

import asyncio

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


def _served(engine: Engine, request: EmbedRequest, monkeypatch) -> tuple[np.ndarray, bool]:
    """The vectors the engine serves for ``request``, and whether preparing went to the executor."""
    hopped = []
    loop = asyncio.new_event_loop()
    real = loop.run_in_executor

    def spy(executor, fn, *args):
        hopped.append(fn)
        return real(executor, fn, *args)

    monkeypatch.setattr(loop, "run_in_executor", spy)

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
    return np.asarray(result.vectors), any(getattr(fn, "__name__", "") == "prepare" for fn in hopped)


def test_a_small_request_is_prepared_on_the_loop_with_the_reference_vectors(engine, monkeypatch):
    assert sum(map(len, SHORT)) <= INLINE_PREPARE_CHARS
    vectors, hopped = _served(engine, EmbedRequest(texts=SHORT), monkeypatch)
    assert not hopped
    np.testing.assert_allclose(vectors, np.asarray(engine.run_sync(EmbedRequest(texts=SHORT)).vectors), atol=1e-6)


def test_a_large_request_is_prepared_off_the_loop_with_the_reference_vectors(engine, monkeypatch):
    assert sum(map(len, LONG)) > INLINE_PREPARE_CHARS
    vectors, hopped = _served(engine, EmbedRequest(texts=LONG), monkeypatch)
    assert hopped
    np.testing.assert_allclose(vectors, np.asarray(engine.run_sync(EmbedRequest(texts=LONG)).vectors), atol=1e-6)
