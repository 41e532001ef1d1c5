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
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def embedding_list(vectors: np.ndarray, encoding_format: str, model: str, prompt_tokens: int) -> dict:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
