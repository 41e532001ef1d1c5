"""Sparse vectors in their wire shapes: OpenAI's list (``/v1/embeddings/sparse``) and TEI's ``/embed_sparse``."""

from __future__ import annotations

from core.api.common import usage
from core.serving import Served


def openai_sparse(served: Served, return_tokens: bool) -> dict:
    result = served.result
    tokens_of = served.engine.task.token_strings if return_tokens else None
    return sparse_list(result.vectors, served.engine.name, result.prompt_tokens, tokens_of)


def sparse_list(vectors, model: str, prompt_tokens: int, tokens_of=None) -> dict:
    """Sparse vectors as ``{indices, values[, tokens]}`` items in the OpenAI list shape."""
    data = []
    for i, v in enumerate(vectors):
        emb = {"indices": v.indices, "values": v.values}
        if tokens_of is not None:
            emb["tokens"] = tokens_of(v.indices)
        data.append({"object": "sparse_embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": model, "usage": usage(prompt_tokens)}


def tei_sparse(vectors) -> list:
    """TEI's ``/embed_sparse`` shape: per input a list of ``{index, value}``."""
    return [
        [{"index": int(i), "value": float(x)} for i, x in zip(v.indices.tolist(), v.values.tolist())]
        for v in vectors
    ]
