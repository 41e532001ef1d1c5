"""Rerank: parity with sentence-transformers' CrossEncoder on the same (tiny) weights."""

from __future__ import annotations

import numpy as np
import pytest

from core.errors import InvalidInput, TooLarge
from core.loading import detect_task, read_model_info
from core.tasks.rerank import RerankRequest
from tests.support.engines import load_engine
from tests.support.sentences import DOCS, QUERY
from tests.support.tokenizer_work import counting_tokenizer


@pytest.fixture(scope="module")
def engine(reranker_dir):
    return load_engine(reranker_dir)


@pytest.fixture(scope="module")
def cross_encoder(reranker_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(reranker_dir), device="cpu")


def test_detects_rerank(reranker_dir, st_cross_encoder_dir):
    assert detect_task(read_model_info(reranker_dir)) == "rerank"
    assert detect_task(read_model_info(st_cross_encoder_dir)) == "rerank"


def test_scores_match_cross_encoder(engine, cross_encoder):
    ours = engine.run_sync(RerankRequest(QUERY, DOCS)).scores
    ref = cross_encoder.predict([(QUERY, d) for d in DOCS])
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
    assert np.argsort(-ours, kind="stable").tolist() == np.argsort(-ref, kind="stable").tolist()
    assert np.ptp(ours) > 1e-3  # the tiny model does tell documents apart


def test_raw_scores_are_logits(engine, cross_encoder):
    ours = engine.run_sync(RerankRequest(QUERY, DOCS, raw_scores=True)).scores
    import torch

    ref = cross_encoder.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)


def test_st_cross_encoder_folder_matches(st_cross_encoder_dir, cross_encoder):
    ours = load_engine(st_cross_encoder_dir).run_sync(RerankRequest(QUERY, DOCS)).scores
    np.testing.assert_allclose(ours, cross_encoder.predict([(QUERY, d) for d in DOCS]), atol=1e-5, rtol=0)


def test_long_document_truncated_document_first(reranker_dir):
    """A pair longer than max_length loses document tokens, like the CrossEncoder's longest-first truncation
    when the document is the longer side."""
    from sentence_transformers import CrossEncoder

    engine = load_engine(reranker_dir, max_length=32)
    ce = CrossEncoder(str(reranker_dir), device="cpu", max_length=32)
    long_doc = " ".join(["Berlin is a large city with many parks and rivers."] * 20)
    pairs = [(QUERY, long_doc), (QUERY, DOCS[0])]
    items = engine.task.prepare(RerankRequest(QUERY, [long_doc, DOCS[0]]))
    assert items[0].cost == 32
    first_sep = items[0].ids.tolist().index(102)
    assert first_sep == engine.task.tokenizer.encode([QUERY])[0].ids.size - 1  # the query is whole
    ours = engine.run_sync(RerankRequest(QUERY, [long_doc, DOCS[0]])).scores
    np.testing.assert_allclose(ours, ce.predict(pairs), atol=1e-5, rtol=0)
    with pytest.raises(TooLarge):
        engine.run_sync(RerankRequest(QUERY, [long_doc], truncate=False))


def test_batched_through_the_batcher_matches(engine, cross_encoder):
    """Many documents are split over several batches (max_batch_size 4) and come back in order."""
    import asyncio

    from tests.support.sentences import SENTENCES

    docs = list(SENTENCES)[:30]
    small = load_engine(engine.spec.path, max_batch_size=4)

    async def run():
        await small.start()
        try:
            return await small(RerankRequest(QUERY, docs))
        finally:
            await small.stop()

    result = asyncio.run(run())
    np.testing.assert_allclose(result.scores, cross_encoder.predict([(QUERY, d) for d in docs]), atol=1e-5, rtol=0)
    assert result.prompt_tokens == sum(len(x.ids) for x in engine.task.prepare(RerankRequest(QUERY, docs)))


def test_empty_documents_rejected(engine):
    with pytest.raises(InvalidInput, match="documents"):
        engine.run_sync(RerankRequest(QUERY, []))


def test_classifier_cannot_be_a_reranker(classifier_dir):
    with pytest.raises(InvalidInput, match="one label"):
        load_engine(classifier_dir, task="rerank")


def test_a_long_query_is_tokenized_once_and_cut_before_pairing(engine):
    """A 200k-character query with 200 documents took 28 s and +1.6 GB when the query was tokenized in
    full once per document; now it is tokenized once and cut to what a pair can keep. The work is
    counted (the text handed to the tokenizer), not timed, so a busy machine cannot fail it."""
    import tracemalloc

    query = "word " * 40_000
    docs = [f"document number {i} about berlin" for i in range(200)]
    limit = engine.task.tokenizer.max_length
    tracemalloc.start()
    with counting_tokenizer(engine.task.tokenizer) as work:
        items = engine.task.prepare(RerankRequest(query, docs))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(items) == 200 and all(it.cost == limit for it in items)
    whole = work.times(query)
    assert whole == 1, f"the whole query was tokenized {whole} times"
    # each pair's query is at most the model's length of it ("word " is a token and a space)
    pair_queries = [t for t in work.texts if t != query and t not in docs]
    assert len(pair_queries) == len(docs) and all(len(q) <= len("word ") * limit for q in pair_queries)
    assert work.chars <= len(query) + len(docs) * len("word ") * limit + sum(map(len, docs)), work.chars
    assert peak < 50 * 1024 * 1024
    cut = engine.run_sync(RerankRequest(query, docs[:3])).scores  # the same scores as the query cut by hand
    by_hand = engine.run_sync(RerankRequest("word " * limit, docs[:3])).scores
    np.testing.assert_allclose(cut, by_hand, atol=1e-6)
    with pytest.raises(TooLarge, match="the query has 40000 tokens"):
        engine.task.prepare(RerankRequest(query, docs, truncate=False))
