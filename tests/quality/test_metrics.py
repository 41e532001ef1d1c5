"""core/quality/metrics.py against rankings worked out by hand, and chunked search against one full sort."""

import math

import numpy as np
import pytest

from core.quality.metrics import TopK, retrieval_scores, scores_of_ranking


def test_figures_of_hand_ranked_queries():
    # query 0: relevant {2} at rank 1; query 1: relevant {0, 3} at ranks 2 and 4; query 2: relevant {4}, not in top 10
    ranking = [[2, 1, 0], [1, 0, 2, 3], [0, 1, 2, 3]]
    relevant = [{2}, {0, 3}, {4}]
    figures = scores_of_ranking(ranking, relevant, ks=(1, 10))
    assert figures["recall@1"] == pytest.approx((1 + 0 + 0) / 3)
    assert figures["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    assert figures["mrr@10"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    ndcg_1 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert figures["ndcg@10"] == pytest.approx((1 + ndcg_1 + 0) / 3)


def test_exact_search_ranks_by_cosine_and_breaks_ties_by_index():
    documents = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [1.0, 1.0]])  # 0 and 2 tie (same direction)
    queries = np.array([[3.0, 0.1], [0.0, 5.0]])
    top = TopK(queries, 3)
    top.add(documents[:1])
    top.add(documents[1:])
    assert top.ranking().tolist() == [[0, 2, 3], [1, 3, 0]]
    figures = retrieval_scores(queries, documents, [{2}, {1}], ks=(1, 10), doc_chunk=1)
    assert figures == {"recall@1": 0.5, "recall@10": 1.0, "mrr@10": 0.75,
                       "ndcg@10": pytest.approx((1 / math.log2(3) + 1) / 2)}


def test_chunked_search_matches_a_full_sort():
    rng = np.random.default_rng(7)
    documents = rng.normal(size=(3000, 16)).astype(np.float32)
    queries = documents[:200] + rng.normal(size=(200, 16)).astype(np.float32)
    relevant = [{i, (i * 13) % 3000} for i in range(200)]
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    full = np.argsort(-(unit(queries) @ unit(documents).T), axis=1, kind="stable")[:, :10]
    expected = scores_of_ranking(full, relevant)
    assert 0 < expected["recall@10"] < 1
    assert retrieval_scores(queries, documents, relevant, doc_chunk=257) == pytest.approx(expected)


def test_bad_relevance_is_refused():
    with pytest.raises(ValueError, match="outside 0..1"):
        retrieval_scores(np.ones((1, 2)), np.ones((2, 2)), [{5}])
    with pytest.raises(ValueError, match="no relevant document"):
        retrieval_scores(np.ones((1, 2)), np.ones((2, 2)), [set()])
