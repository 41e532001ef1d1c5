"""Wire shapes over the serving layer's results (OpenAI, Infinity, Cohere, TEI), built straight from
numpy arrays: no per-float Python objects on the hot path."""

from __future__ import annotations

import base64
import math
import time
import uuid
from typing import Any, Sequence

import numpy as np
import orjson

from core.api.serving import Served

_OPTS = orjson.OPT_SERIALIZE_NUMPY


def dumps(obj) -> bytes:
    return orjson.dumps(obj, option=_OPTS)


def encode_vector(vector: np.ndarray, encoding_format: str):
    """``float``: the array itself (orjson writes it as a JSON list); ``base64``: little-endian float32.
    A 2-D array (a multi-vector item) becomes a list of vectors, each encoded the same way."""
    if encoding_format != "float" and vector.ndim == 2:
        return [encode_vector(row, encoding_format) for row in vector]
    if encoding_format == "base64_packed" and vector.dtype in (np.int8, np.uint8):  # the raw bytes
        return base64.b64encode(vector.tobytes()).decode("ascii")
    if encoding_format in ("base64", "base64_packed"):
        # little-endian float32, whatever the type: the OpenAI SDK asks for base64 by default and decodes
        # float32, so quantized values travel as float32 integers and decode to the right numbers
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
        "usage": usage(prompt_tokens),
    }


def usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def response_id(kind: str) -> tuple[str, int]:
    return f"{kind}-{uuid.uuid4().hex}", int(time.time())


def ranked(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices by descending score (ties keep input order), cut to ``top_n``."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order[:top_n] if top_n is not None else order


def openai_embeddings(served: Served, encoding_format: str) -> dict:
    result = served.result
    return embedding_list(result.vectors, encoding_format, served.engine.name, result.prompt_tokens)


def openai_sparse(served: Served, return_tokens: bool) -> dict:
    result = served.result
    tokens_of = served.engine.task.token_strings if return_tokens else None
    return sparse_list(result.vectors, served.engine.name, result.prompt_tokens, tokens_of)


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


def cohere_embed(served: Served, by_type: dict[str, np.ndarray], texts: Sequence[str] | None, *, version: int = 2,
                 floats_only: bool = False) -> dict:
    """Cohere ``embeddings_by_type``: ``{id, embeddings: {float: [[...]], int8: [[...]], base64: [...]},
    texts, meta}`` (``base64``: little-endian float32 bytes, as Cohere encodes it); ``floats_only`` (v1
    without ``embedding_types``): ``embeddings_floats``, ``{id, embeddings: [[...]], texts, meta}``."""
    embeddings: dict[str, Any] = {}
    for kind, vectors in by_type.items():
        if kind == "base64":
            embeddings[kind] = [encode_vector(v, "base64") for v in vectors]
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


def score_list(served: Served) -> dict:
    data = [{"object": "score", "index": i, "score": float(s)} for i, s in enumerate(served.result.scores)]
    return {"object": "list", "data": data, "model": served.engine.name, "usage": usage(served.result.prompt_tokens)}


def classify_list(served: Served, columns: list[int], top_k: int | None) -> dict:
    """Infinity's classify shape: per input, ``{label, score}`` best first, over the columns asked for."""
    labels = served.engine.task.labels
    sub = np.asarray(columns)
    data = []
    for row in served.result.scores:
        order = sub[np.argsort(-row[sub], kind="stable")].tolist()
        if top_k is not None:
            order = order[:top_k]
        data.append([{"label": labels[j], "score": float(row[j])} for j in order])
    rid, created = response_id("classify")
    return {"object": "classify", "id": rid, "created": created, "data": data, "model": served.engine.name,
            "usage": usage(served.result.prompt_tokens)}


def tei_predict(served: Served, single: bool) -> list:
    labels = served.result.labels
    out = [[{"score": float(row[j]), "label": labels[j]} for j in ranked(row)] for row in served.result.scores]
    return out[0] if single else out


def token_list(served: Served) -> dict:
    """``/v1/tokenize``: ids, token strings and counts per text."""
    rows = served.result
    data = [{"object": "tokens", "index": i, "ids": [p.id for p in row], "tokens": [p.text for p in row],
             "count": len(row)} for i, row in enumerate(rows)]
    tokenizer = served.engine.task.tokenizer
    return {"object": "list", "data": data, "model": served.engine.name, "max_length": tokenizer.max_length,
            "usage": usage(sum(len(row) for row in rows))}


def tei_tokens(served: Served) -> list:
    return [[{"id": p.id, "text": p.text, "special": p.special, "start": p.start, "stop": p.stop} for p in row]
            for row in served.result]


def model_list(cards: list[dict]) -> dict:
    return {"object": "list", "data": cards}


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
        engine = registry.get(model, "embeddings")
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
