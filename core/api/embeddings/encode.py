"""Embeddings in their wire shapes (OpenAI, Cohere), built straight from numpy arrays: no per-float Python
objects on the hot path; and the least size of an answer, told from the request alone."""

from __future__ import annotations

import base64
import math
from typing import Any, Sequence

import numpy as np

from core.api.common import response_id, usage
from core.capabilities import Capability
from core.serving import Served


def encode_vector(vector: np.ndarray, encoding_format: str):
    """``float``: the array itself (orjson writes it as a JSON list); ``base64``: little-endian float32.
    A 2-D array (a multi-vector item) becomes a list of vectors, each encoded the same way."""
    if encoding_format != "float" and vector.ndim == 2:
        return encode_rows(vector, encoding_format)
    if encoding_format == "base64_packed" and vector.dtype in (np.int8, np.uint8):  # the raw bytes
        return base64.b64encode(vector.tobytes()).decode("ascii")
    if encoding_format in ("base64", "base64_packed"):
        # little-endian float32, whatever the type: the OpenAI SDK asks for base64 by default and decodes
        # float32, so quantized values travel as float32 integers and decode to the right numbers
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def encode_rows(vectors: Any, encoding_format: str) -> list:
    """``encode_vector`` of each of ``vectors``; the rows of a float matrix as base64 in one conversion to
    little-endian float32 bytes, each row's base64 from its span of them (a row of a multiple of 3 bytes: all
    rows in one base64 call, cut at the row's length)."""
    if not (len(vectors) > 1 and encoding_format == "base64" and isinstance(vectors, np.ndarray)
            and vectors.ndim == 2 and vectors.dtype.kind == "f"):
        return [encode_vector(v, encoding_format) for v in vectors]
    raw = np.ascontiguousarray(vectors, dtype="<f4").tobytes()
    width = vectors.shape[1] * 4
    if width % 3 == 0:
        text = base64.b64encode(raw).decode("ascii")
        chars = width // 3 * 4
        return [text[start:start + chars] for start in range(0, len(text), chars)]
    view = memoryview(raw)
    return [base64.b64encode(view[start:start + width]).decode("ascii") for start in range(0, len(raw), width)]


def embedding_list(vectors: np.ndarray, encoding_format: str, model: str, prompt_tokens: int) -> dict:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encoded}
            for i, encoded in enumerate(encode_rows(vectors, encoding_format))
        ],
        "model": model,
        "usage": usage(prompt_tokens),
    }


def openai_embeddings(served: Served, encoding_format: str) -> dict:
    result = served.result
    return embedding_list(result.vectors, encoding_format, served.engine.name, result.prompt_tokens)


def cohere_embed(served: Served, by_type: dict[str, np.ndarray], texts: Sequence[str] | None, *, version: int = 2,
                 floats_only: bool = False) -> dict:
    """Cohere ``embeddings_by_type``: ``{id, embeddings: {float: [[...]], int8: [[...]], base64: [...]},
    texts, meta}`` (``base64``: little-endian float32 bytes, as Cohere encodes it); ``floats_only`` (v1
    without ``embedding_types``): ``embeddings_floats``, ``{id, embeddings: [[...]], texts, meta}``."""
    embeddings: dict[str, Any] = {}
    for kind, vectors in by_type.items():
        if kind == "base64":
            embeddings[kind] = encode_rows(vectors, "base64")
        else:
            embeddings[kind] = vectors
    rid, _ = response_id("embed")
    tokens = served.result.prompt_tokens
    out = {"id": rid, "embeddings": embeddings, "response_type": "embeddings_by_type",
           "meta": {"api_version": {"version": str(version)}, "billed_units": {"input_tokens": tokens}}}
    if floats_only:
        out.update(embeddings=embeddings["float"], response_type="embeddings_floats")
    if texts is not None or floats_only:
        out["texts"] = list(texts or [])
    return out


#: the fewest bytes one value of a float embedding takes in JSON (digits, sign, point, separator). float32 values
#: of a unit vector print with 8-9 significant digits: 12.1-12.4 bytes a value measured for all-MiniLM-L6-v2.
#: Counted low, so that no request whose answer fits is refused.
FLOAT_JSON_BYTES = 11

#: ``{"object":"embedding","index":N,"embedding":...}`` around each vector, at least
ITEM_JSON_BYTES = 45


def _input_count(value: Any) -> int | None:
    if isinstance(value, str):
        return 1
    if isinstance(value, list) and value:
        return 1 if isinstance(value[0], int) else len(value)
    return None


def least_embeddings_answer_bytes(payload: Any, registry, max_items: int | None = None) -> int | None:
    """The fewest bytes the JSON answer to an embeddings request body can take, from the body alone (inputs ×
    dimension × bytes per value of the encoding), so that a platform with a response limit can refuse it before
    any inference. None when it cannot be told: a body the app will refuse itself (no inputs, more than
    ``max_items``, a model that is not a name, an unknown encoding), another modality, a multi-vector or
    quantized embedding."""
    from core.errors import TesseraError
    from core.tasks.embed import EmbedTask

    if not isinstance(payload, dict):
        return None
    count, model = _input_count(payload.get("input")), payload.get("model")
    if count is None or (max_items is not None and count > max_items):
        return None  # the app's own 400 / 413 names the real problem
    if (model is not None and not isinstance(model, str)) or payload.get("modality", "text") != "text":
        return None
    try:
        engine = registry.get(model, Capability.EMBEDDINGS)
    except TesseraError:
        return None
    task = engine.task
    if not isinstance(task, EmbedTask) or not task.dimension:
        return None
    if (payload.get("embedding_type") or engine.spec.embedding_dtype) != "float":
        return None
    dimension = task.dimension
    asked = payload.get("dimensions")
    if isinstance(asked, int) and not isinstance(asked, bool) and 0 < asked < dimension:
        dimension = asked
    encoding = payload.get("encoding_format") or "float"
    if encoding == "float":
        per_vector = FLOAT_JSON_BYTES * dimension
    elif encoding == "base64":  # the float32 bytes as one base64 string, in quotes
        per_vector = 4 * math.ceil(4 * dimension / 3) + 2
    else:
        return None
    return count * (per_vector + ITEM_JSON_BYTES)
