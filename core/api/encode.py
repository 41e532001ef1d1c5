"""Response bodies built straight from numpy arrays: no per-float Python objects on the hot path."""

from __future__ import annotations

import base64

import numpy as np
import orjson

_OPTS = orjson.OPT_SERIALIZE_NUMPY


def dumps(obj) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


def encode_vector(vector: np.ndarray, encoding_format: str):
    """``float``: the array itself (orjson writes it as a JSON list); ``base64``: little-endian float32.
    A 2-D array (a multi-vector item) becomes a list of vectors, each encoded the same way."""
    if encoding_format == "base64" and vector.ndim == 2:
        return [encode_vector(row, encoding_format) for row in vector]
    if encoding_format == "base64":  # float32 little-endian; quantized types: their own bytes
        raw = vector if vector.dtype in (np.int8, np.uint8) else np.ascontiguousarray(vector, dtype="<f4")
        return base64.b64encode(raw.tobytes()).decode("ascii")
    return vector


def embedding_list(vectors: np.ndarray, encoding_format: str, model: str, prompt_tokens: int) -> dict:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": usage(prompt_tokens),
    }


def usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


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
