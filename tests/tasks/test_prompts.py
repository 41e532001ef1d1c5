"""Prompts on embeddings: parity with sentence-transformers' encode(prompt_name=..., prompt=...), with the
Pooling's include_prompt true (MiniLM as shipped) and false (prompt tokens out of mean pooling)."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import InvalidInput
from core.tasks.embed import EmbedRequest
from tests.support.engines import load_engine
from tests.support.text_models import PROMPTS

TEXTS = ["how do I bake bread?", "Bread is baked from flour, water, yeast and salt."]


@pytest.fixture(scope="module")
def st_prompts(prompts_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(prompts_dir), device="cpu")


def test_prompt_name_excluded_from_pooling_matches_st(prompts_dir, st_prompts):
    engine = load_engine(prompts_dir)
    assert engine.task.info.include_prompt is False
    ours = engine.run_sync(EmbedRequest(texts=TEXTS, prompt_name="query"))
    ref = st_prompts.encode(TEXTS, prompt_name="query", normalize_embeddings=False)
    np.testing.assert_allclose(ours.vectors, ref, atol=1e-5)
    plain = engine.run_sync(EmbedRequest(texts=TEXTS))
    assert not np.allclose(ours.vectors, plain.vectors, atol=1e-3)
    # the prompt's tokens count in usage ("query: " is 2 tokens: "query" and ":")
    assert engine.task.tokenizer.prompt_length("query: ") == 3  # [CLS] query : (the part left out of pooling)
    assert ours.prompt_tokens == plain.prompt_tokens + 2 * 2


def test_literal_prompt_included_matches_st(minilm_dir, st_minilm):
    engine = load_engine(minilm_dir, prompts={"q": "Represent this sentence for searching: "})
    ours = engine.run_sync(EmbedRequest(texts=TEXTS, prompt_name="q"))
    ref = st_minilm.encode(TEXTS, prompt="Represent this sentence for searching: ")
    np.testing.assert_allclose(ours.vectors, ref, atol=1e-5)
    lit = engine.run_sync(EmbedRequest(texts=TEXTS, prompt="Represent this sentence for searching: "))
    np.testing.assert_allclose(lit.vectors, ref, atol=1e-5)


def test_default_prompt_from_spec(prompts_dir, st_prompts):
    engine = load_engine(prompts_dir, default_prompt_name="passage")
    ours = engine.run_sync(EmbedRequest(texts=TEXTS))
    ref = st_prompts.encode(TEXTS, prompt=PROMPTS["passage"], normalize_embeddings=False)
    np.testing.assert_allclose(ours.vectors, ref, atol=1e-5)


def test_unknown_prompt_name(prompts_dir):
    engine = load_engine(prompts_dir)
    with pytest.raises(InvalidInput, match="passage"):
        engine.run_sync(EmbedRequest(texts=TEXTS, prompt_name="nope"))
