"""The parts of ``scripts/compare_infinity.py --task``: the model-folder builders (the same code as the
benchmark's MiniLM-L6 and ViT-B/32-sized folders, at a tiny size here) give folders Tessera serves in its
default configuration; each task's plain loop (the "Tessera/plain" denominator) computes the numbers the
server computes; the answers' checks refuse wrong answers. Not timed."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from benchmarks import task_compare
from benchmarks.media import PHOTO_SIZES, photo_uris
from benchmarks.plain_ort import batches, plain_ort_classifier, plain_ort_reranker, timed_rate
from benchmarks.plain_torch import plain_torch_clip
from benchmarks.task_models import CLASS_LABELS, build_classifier, build_clip, build_cross_encoder
from core.config import ModelSpec, Settings
from core.inprocess import AsyncModels

TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TINY_CLIP = dict(text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
                 vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                             image_size=32, patch_size=8),
                 projection_dim=16)
QUERY = "what does the server batch"
DOCS = ["the server batches requests", "a model of the vector search", "token", "latency and throughput of it"]


def _served(folder, cache_dir, call, **spec):
    """``call(engine)`` on an AsyncModels serving ``folder`` as "m" with a spec of path and name only
    (and ``spec``: the dtype)."""
    async def run():
        models = [ModelSpec(path=folder, name="m", **spec)]
        async with AsyncModels(Settings(models=models, cache_dir=cache_dir)) as engine:
            return await call(engine)

    return asyncio.run(run())


def _export(folder, out):
    from core.convert.onnx_export import export_head

    export_head(folder, out, "sequence-classification")
    return out


def test_cross_encoder_folder_serves_and_the_plain_reranker_matches(minilm_dir, tmp_path):
    folder = tmp_path / "rerank"
    build_cross_encoder(minilm_dir, folder, TINY_BERT)
    served = _served(folder, tmp_path / "cache", lambda e: e.rerank(QUERY, DOCS))
    plain = plain_ort_reranker(_export(folder, tmp_path / "rerank.onnx"), folder / "tokenizer.json", threads=1)
    got = plain(QUERY, DOCS)
    assert got.shape == (len(DOCS),) and np.ptp(got) > 1e-3  # random weights still tell documents apart
    np.testing.assert_allclose(got, served, atol=1e-5)
    assert timed_rate(lambda docs: plain(QUERY, docs), batches(DOCS, 2), 0.05) > 0


def test_classifier_folder_serves_and_the_plain_classifier_matches(minilm_dir, tmp_path):
    folder = tmp_path / "classify"
    build_classifier(minilm_dir, folder, TINY_BERT)
    labels, served = _served(folder, tmp_path / "cache", lambda e: e.classify(DOCS))
    assert labels == list(CLASS_LABELS.values())
    got = plain_ort_classifier(_export(folder, tmp_path / "classify.onnx"), folder / "tokenizer.json", threads=1)(DOCS)
    np.testing.assert_allclose(got.sum(axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(got, served, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_clip_folder_serves_and_the_plain_clip_loop_matches(tmp_path, dtype):
    folder = tmp_path / "clip"
    build_clip(folder, TINY_CLIP)
    uris = photo_uris(4)
    texts = ["a photo of the model", "the vector search engine"]

    async def both(engine):
        return await engine.embed(uris, modality="image"), await engine.embed(texts)

    images, words = _served(folder, tmp_path / "cache", both, dtype=dtype)
    plain_images, plain_texts = plain_torch_clip(folder, threads=1, dtype=dtype)
    assert images.shape == (4, 16) and words.shape == (2, 16)
    np.testing.assert_allclose(plain_images(uris), images, atol=1e-4)
    np.testing.assert_allclose(plain_texts(texts), words, atol=1e-4)


def test_photos_are_deterministic_jpegs_of_the_listed_sizes():
    import base64
    import io

    from PIL import Image

    uris = photo_uris(len(PHOTO_SIZES))
    assert uris == photo_uris(len(PHOTO_SIZES))
    sizes = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).size for u in uris]
    assert all(u.startswith("data:image/jpeg;base64,") for u in uris)
    assert sizes == list(PHOTO_SIZES)


def _rerank_body(pairs):
    return json.dumps({"results": [{"index": i, "relevance_score": s} for i, s in pairs]}).encode()


def test_rerank_check_wants_every_document_once_best_first():
    assert task_compare.check_rerank(200, _rerank_body([(1, 0.9), (0, 0.5), (2, 0.1)]), 3)
    assert not task_compare.check_rerank(200, _rerank_body([(0, 0.5), (1, 0.9), (2, 0.1)]), 3)  # not sorted
    assert not task_compare.check_rerank(200, _rerank_body([(1, 0.9), (1, 0.5), (2, 0.1)]), 3)  # index twice
    assert not task_compare.check_rerank(200, _rerank_body([(1, 0.9), (0, float("nan")), (2, 0.1)]), 3)
    assert not task_compare.check_rerank(200, _rerank_body([(1, 0.9), (0, 0.5)]), 3)
    assert not task_compare.check_rerank(500, _rerank_body([(0, 0.5)]), 1)


@pytest.mark.parametrize("entry, ok", [
    ([{"label": "a", "score": 0.7}, {"label": "b", "score": 0.3}], True),
    ([{"label": "a", "score": 0.7}], False),
    ([{"label": "a", "score": 0.7}, {"label": "a", "score": 0.3}], False),
])
def test_classify_check_wants_every_label_per_text(entry, ok):
    body = json.dumps({"data": [entry, entry]}).encode()
    assert task_compare.check_classify(200, body, 2, ["a", "b"]) is ok
    assert not task_compare.check_classify(200, body, 3, ["a", "b"])
