"""The in-process API gives what the HTTP routes give, through the same batchers, without a server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from core.config import Settings
from core.inprocess import AsyncModels

TEXTS = ["an in-process call", "batch jobs embed without HTTP", "x"]


def test_embed_rerank_classify_in_process(minilm_onnx_dir, reranker_dir, classifier_dir, st_minilm):
    from sentence_transformers import CrossEncoder

    settings = Settings(threads=2, max_items_per_request=2, models=[{"path": str(minilm_onnx_dir), "name": "e"},
                                           {"path": str(reranker_dir), "name": "r"},
                                           {"path": str(classifier_dir), "name": "c"}])

    async def main():
        async with AsyncModels(settings) as engine:
            assert engine.models == ["c", "e", "r"]
            many = await asyncio.gather(*(engine.embed([t], "e") for t in TEXTS))  # concurrent calls share a batcher
            batched = await engine.embed(TEXTS, "e")  # 3 texts, 2 per request: split, in order
            scores = await engine.rerank("a query", TEXTS[:2], "r")
            labels, probs = await engine.classify(TEXTS[:2], "c")
            return np.concatenate(many), batched, scores, labels, probs

    many, batched, scores, labels, probs = asyncio.run(main())
    np.testing.assert_allclose(batched, st_minilm.encode(TEXTS), atol=1e-4)
    np.testing.assert_allclose(many, batched, atol=1e-6)
    ref = CrossEncoder(str(reranker_dir), device="cpu").predict([("a query", t) for t in TEXTS[:2]])
    np.testing.assert_allclose(scores, ref, atol=1e-5)
    assert probs.shape == (2, len(labels)) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)


def test_the_former_name_still_imports_with_a_warning():
    import core.inprocess

    with pytest.warns(DeprecationWarning, match="AsyncModels"):
        from core.inprocess import AsyncEngine
    assert AsyncEngine is AsyncModels
    with pytest.raises(AttributeError):
        core.inprocess.NoSuchName
