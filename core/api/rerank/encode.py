"""Rerank answers: Infinity's and Cohere v1's shape, Cohere v2's, TEI's."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from core.api.common import ranked, response_id, usage
from core.serving import Served


def _relevance(scores: np.ndarray, top_n: int | None, documents: Sequence[Any] | None) -> list[dict]:
    """``[{index, relevance_score, document?}]`` best first; ``documents``: what each item shows, if any."""
    results = []
    for j in ranked(scores, top_n):
        item = {"index": j, "relevance_score": float(scores[j])}
        if documents is not None:
            item["document"] = documents[j]
        results.append(item)
    return results


def rerank_list(served: Served, documents: Sequence[Any], top_n: int | None, return_documents: bool) -> dict:
    """Infinity's and Cohere v1's rerank shape; ``document`` is what the request sent for it."""
    results = _relevance(served.result.scores, top_n, documents if return_documents else None)
    rid, created = response_id("rerank")
    return {"object": "rerank", "id": rid, "created": created, "results": results, "model": served.engine.name,
            "usage": usage(served.result.prompt_tokens)}


def cohere_rerank(served: Served, texts: Sequence[str], top_n: int | None, return_documents: bool) -> dict:
    """Cohere v2: ``{id, results: [{index, relevance_score, document?: {text}}], meta}``."""
    shown = [{"text": t} for t in texts] if return_documents else None
    results = _relevance(served.result.scores, top_n, shown)
    rid, _ = response_id("rerank")
    return {"id": rid, "results": results,
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1},
                     "tokens": {"input_tokens": served.result.prompt_tokens, "output_tokens": 0}}}


def tei_rerank(served: Served, texts: Sequence[str], return_text: bool) -> list:
    """TEI: ``[{index, score, text?}]`` sorted by score."""
    scores = served.result.scores
    out = []
    for j in ranked(scores):
        item = {"index": j, "score": float(scores[j])}
        if return_text:
            item["text"] = texts[j]
        out.append(item)
    return out
