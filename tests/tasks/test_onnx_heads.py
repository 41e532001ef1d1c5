"""ONNX export of the rerank/classify (sequence-classification) and SPLADE heads, served by the ONNX backend,
against the references used for torch (CrossEncoder, transformers)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.convert import onnx_export
from core.tasks.classify import ClassifyRequest
from core.tasks.embed import EmbedRequest
from core.tasks.rerank import RerankRequest
from tests.support.cache import ONNX_EXPORT_SOURCES, cached_build
from tests.support.engines import load_engine

QUERY = "How many people live in Berlin?"
DOCS = ["Berlin has 3.7 million inhabitants.", "Paris is in France.", "Cats sleep a lot.", ""]


def exported(name: str, src: Path) -> Path:
    return cached_build(name, [*ONNX_EXPORT_SOURCES, src / "model.safetensors"],
                        partial(onnx_export.export_folder, src))


@pytest.fixture(scope="module")
def reranker_onnx(reranker_dir):
    return exported("tiny-reranker-onnx", reranker_dir)


def test_reranker_onnx_matches_cross_encoder(reranker_dir, reranker_onnx):
    from sentence_transformers import CrossEncoder

    engine = load_engine(reranker_onnx, backend="onnx")
    assert engine.backend.name == "onnx" and engine.task.name == "rerank"
    ref = CrossEncoder(str(reranker_dir), device="cpu").predict([(QUERY, d) for d in DOCS])
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, DOCS)).scores, ref, atol=1e-5)


def test_classifier_onnx_matches_torch(classifier_dir):
    onnx_dir = exported("tiny-classifier-onnx", classifier_dir)
    texts = ["I love it", "I hate it", "meh"]
    ours = load_engine(onnx_dir, backend="onnx").run_sync(ClassifyRequest(texts=texts)).scores
    ref = load_engine(classifier_dir).run_sync(ClassifyRequest(texts=texts)).scores
    np.testing.assert_allclose(ours, ref, atol=1e-5)


def test_splade_onnx_matches_torch(splade_dir):
    onnx_dir = exported("splade-tiny-onnx", splade_dir)
    texts = ["What is the capital of Germany?", "Berlin is the capital and largest city of Germany."]
    ours = load_engine(onnx_dir, backend="onnx").run_sync(EmbedRequest(texts=texts)).vectors
    ref = load_engine(splade_dir).run_sync(EmbedRequest(texts=texts)).vectors
    for a, b in zip(ours, ref):
        assert a.indices.tolist() == b.indices.tolist()
        np.testing.assert_allclose(a.values, b.values, atol=1e-3)
