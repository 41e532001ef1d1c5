"""Exact retrieval scoring in numpy: every query against every document by cosine, the top ``k`` kept.

The documents are scored a chunk at a time against a chunk of queries and only each query's running top ``k``
is kept, so the score matrix never exceeds ``query_chunk × doc_chunk`` floats: 100k documents (or more) fit
in bounded memory. :class:`TopK` takes the document vectors a chunk at a time (``tessera eval`` embeds and
scores the corpus chunk by chunk, never holding all of it); :func:`retrieval_scores` is the one-call form.

Relevance is binary and by document index. The figures follow the usual definitions (BEIR / MTEB):
``recall@k`` is the share of a query's relevant documents found in its top ``k``; ``mrr@k`` is 1 / the rank of
the first relevant document within the top ``k`` (0 when none is); ``ndcg@k`` is the DCG of the top ``k``
(a relevant document at rank ``r`` adds ``1 / log2(r + 1)``) over the DCG of an ideal ranking. Each is the mean
over queries. Equal scores rank the lower document index first, so a ranking is deterministic.
"""

from __future__ import annotations

import numpy as np

DEFAULT_KS = (1, 10)
#: rows of the query × document score block; 1,024 × 8,192 float32 is 32 MiB
QUERY_CHUNK = 1024
DOC_CHUNK = 8192


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 length as float32 (a zero row stays zero rather than becoming NaN)."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"vectors must be a 2-D array (rows × dimensions), got shape {array.shape}")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.where(norms > 0, norms, 1.0)


class TopK:
    """Each query's ``k`` best documents so far, fed document vectors chunk by chunk (in index order)."""

    def __init__(self, queries: np.ndarray, k: int, *, query_chunk: int = QUERY_CHUNK):
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.queries = normalized(queries)
        self.k = k
        self.query_chunk = query_chunk
        count = len(self.queries)
        self.scores = np.full((count, 0), -np.inf, dtype=np.float32)
        self.indices = np.zeros((count, 0), dtype=np.int64)
        self.documents = 0

    def add(self, documents: np.ndarray) -> None:
        """Score the next documents (their indices continue from the ones added before) and keep the top k."""
        block = normalized(documents)
        if block.shape[1] != self.queries.shape[1]:
            raise ValueError(f"document vectors have {block.shape[1]} dimensions, the queries "
                             f"{self.queries.shape[1]}")
        offset = self.documents
        self.documents += len(block)
        if not len(block) or not len(self.queries):
            return
        merged_scores, merged_indices = [], []
        for start in range(0, len(self.queries), self.query_chunk):
            rows = slice(start, start + self.query_chunk)
            scores = self.queries[rows] @ block.T
            indices = np.broadcast_to(np.arange(offset, offset + len(block), dtype=np.int64), scores.shape)
            scores = np.concatenate([self.scores[rows], scores], axis=1)
            indices = np.concatenate([self.indices[rows], indices], axis=1)
            best_scores, best_indices = _best(scores, indices, self.k)
            merged_scores.append(best_scores)
            merged_indices.append(best_indices)
        self.scores = np.concatenate(merged_scores)
        self.indices = np.concatenate(merged_indices)

    def ranking(self) -> np.ndarray:
        """The document indices of each query's top ``k``, best first (fewer when there are fewer documents)."""
        return self.indices


def _best(scores: np.ndarray, indices: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k highest scores of each row (ties: lower index first), sorted best first."""
    if scores.shape[1] > k:  # cut to the candidates first: a full sort of a wide block is the slow part
        kth = np.partition(scores, scores.shape[1] - k, axis=1)[:, -k][:, None]
        keep = scores >= kth  # ties at the k-th score all stay, the sort below decides between them
        widest = int(keep.sum(axis=1).max())
        order = np.argsort(~keep, axis=1, kind="stable")[:, :widest]
        scores = np.take_along_axis(scores, order, axis=1)
        indices = np.take_along_axis(indices, order, axis=1)
    order = np.lexsort((indices, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(indices, order, axis=1)


def scores_of_ranking(ranking: np.ndarray | list, relevant: list[set[int]], ks=DEFAULT_KS) -> dict[str, float]:
    """recall@k for each k, and MRR and nDCG at the largest k, from each query's ranked document indices."""
    ks = tuple(sorted(set(int(k) for k in ks)))
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive cut-offs, got {ks}")
    if len(ranking) != len(relevant):
        raise ValueError(f"{len(ranking)} rankings for {len(relevant)} relevance sets")
    if not len(relevant):
        raise ValueError("no queries to score")
    deepest = ks[-1]
    discounts = 1.0 / np.log2(np.arange(2, deepest + 2))
    recall = {k: 0.0 for k in ks}
    reciprocal_rank = ndcg = 0.0
    for number, (ranked, wanted) in enumerate(zip(ranking, relevant)):
        if not wanted:
            raise ValueError(f"query {number} has no relevant document")
        hits = np.array([int(doc) in wanted for doc in list(ranked)[:deepest]], dtype=bool)
        for k in ks:
            recall[k] += hits[:k].sum() / len(wanted)
        if hits.any():
            reciprocal_rank += 1.0 / (int(np.argmax(hits)) + 1)
        ideal = discounts[:min(len(wanted), deepest)].sum()
        ndcg += discounts[:len(hits)][hits].sum() / ideal
    count = len(relevant)
    figures = {f"recall@{k}": float(recall[k] / count) for k in ks}
    figures[f"mrr@{deepest}"] = float(reciprocal_rank / count)
    figures[f"ndcg@{deepest}"] = float(ndcg / count)
    return figures


def check_relevance(relevant: list[set[int]], queries: int, documents: int) -> None:
    """One non-empty set of in-range document indices per query, or a ValueError naming the first bad one."""
    if len(relevant) != queries:
        raise ValueError(f"{queries} queries but {len(relevant)} relevance sets")
    for number, wanted in enumerate(relevant):
        if not wanted:
            raise ValueError(f"query {number} has no relevant document")
        outside = [doc for doc in wanted if not 0 <= int(doc) < documents]
        if outside:
            raise ValueError(f"query {number}: relevant document index {outside[0]} is outside 0..{documents - 1}")


def retrieval_scores(queries: np.ndarray, documents: np.ndarray, relevant: list[set[int]], ks=DEFAULT_KS, *,
                     doc_chunk: int = DOC_CHUNK) -> dict[str, float]:
    """recall@k (each k of ``ks``), mrr@K and ndcg@K (K the largest k) of exact cosine search of every query over
    every document; ``relevant[i]`` holds the indices (rows of ``documents``) relevant to query ``i``."""
    documents = np.asarray(documents)
    check_relevance(relevant, len(queries), len(documents))
    top = TopK(queries, max(ks))
    for start in range(0, len(documents), doc_chunk):
        top.add(documents[start:start + doc_chunk])
    return scores_of_ranking(top.ranking(), relevant, ks)
