"""Gemma 3 embedders (EmbeddingGemma layout: ``Gemma3TextModel`` with bidirectional attention over sliding and
full layers → mean Pooling → Dense → Dense → Normalize, query/document prompts). The ONNX export builds the
bidirectional masks itself (transformers' mask functions do not trace: ``RuntimeError: unordered_map::at``), so
``scripts/export_onnx.py`` and ``auto`` (the export cache) serve it through ONNX Runtime. Parity with
sentence-transformers on torch, ONNX and ``auto``, with each prompt; batched == single; CTranslate2 refuses it."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import TesseraError
from core.tasks.embed import EmbedRequest
from tests.support import family_models, text_models
from tests.support.cache import ONNX_EXPORT_SOURCES, cached_build
from tests.support.engines import run_concurrently

SOURCES = [Path(family_models.__file__), Path(text_models.__file__)]
MIN_COSINE, MAX_ABS = 0.99999, 1e-5


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    return cached_build("tiny-embedding-gemma", SOURCES, family_models.build_embedding_gemma)


@pytest.fixture(scope="session")
def gemma_onnx_dir(gemma_dir) -> Path:
    pytest.importorskip("onnxruntime")
    from core.convert import onnx_export

    return cached_build("tiny-embedding-gemma-onnx", [*SOURCES, *ONNX_EXPORT_SOURCES],
                        lambda out: onnx_export.export_folder(gemma_dir, out))


@pytest.fixture(scope="session")
def gemma_reference(gemma_dir, sentences):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gemma_dir), device="cpu")
    assert type(st[0].auto_model).__name__ == "Gemma3TextModel"
    return {p: st.encode(sentences, batch_size=16, convert_to_numpy=True, prompt_name=p)
            for p in (None, "query", "document")}


def test_folder_is_saved_as_embedding_gemma_is(gemma_dir, sentences):
    from core.tokenization import TextTokenizer

    config = json.loads((gemma_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3TextModel"] and config["use_bidirectional_attention"] is True
    assert set(config["layer_types"]) == {"sliding_attention", "full_attention"}
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((gemma_dir / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    # texts longer than the sliding window, so the sliding layers' mask matters
    lengths = [len(e.ids) for e in TextTokenizer(gemma_dir, 256).encode(sentences)]
    assert max(lengths) > 4 * config["sliding_window"]


@pytest.mark.parametrize("prompt_name", [None, "query", "document"])
@pytest.mark.parametrize("backend", ["torch", "onnx", "auto"])
def test_parity_with_sentence_transformers(gemma_dir, gemma_onnx_dir, gemma_reference, sentences,
                                           tmp_path_factory, backend, prompt_name):
    folder = gemma_onnx_dir if backend == "onnx" else gemma_dir
    settings = Settings(threads=2, auto_export=True, cache_dir=tmp_path_factory.mktemp("gemma-cache"))
    engine = Engine.load(ModelSpec(path=folder, backend=backend), settings)
    assert engine.backend.name == ("torch" if backend == "torch" else "onnx"), engine.choice.reason
    ref = gemma_reference[prompt_name]
    got = engine.run_sync(EmbedRequest(texts=sentences, prompt_name=prompt_name)).vectors
    assert got.shape == ref.shape == (len(sentences), 24)
    cos, diff = (got * ref).sum(1), np.abs(got - ref).max()
    print(f"\n[parity] embedding-gemma {backend} prompt={prompt_name}: max abs diff {diff:.2e}, "
          f"min cosine {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE and diff <= MAX_ABS
    assert np.abs(ref - ref.mean(axis=0)).mean() > 100 * MAX_ABS


def test_onnx_batched_through_batcher_equals_single(gemma_onnx_dir, sentences):
    """Padded batches of mixed lengths: the graph's masks keep padding out of every real token's attention."""
    texts = sentences[:24]
    engine = Engine.load(ModelSpec(path=gemma_onnx_dir, backend="onnx"), Settings(threads=2))
    singles = np.stack([engine.run_sync(EmbedRequest(texts=[t], prompt_name="query")).vectors[0] for t in texts])
    results = run_concurrently(engine, [EmbedRequest(texts=[t], prompt_name="query") for t in texts])
    np.testing.assert_allclose(np.stack([r.vectors[0] for r in results]), singles, atol=2e-5)


def test_ct2_refuses_gemma3_by_name(gemma_dir):
    pytest.importorskip("ctranslate2")
    with pytest.raises(TesseraError, match="'gemma3_text'.*backend 'torch' or 'onnx'"):
        Engine.load(ModelSpec(path=gemma_dir, backend="ct2"), Settings(threads=2))
