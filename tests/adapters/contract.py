"""The contract every surface answers the same way: one list of request → expected-response cases.

A surface is a function ``send(case) -> Reply``; ``tests/adapters/test_contract.py`` runs every case
against the local app, the Lambda handler (function-URL and HTTP-API events), the SageMaker ``serve``
process (``POST`` routes through ``/invocations``) and the Modal class's app. Add a case here and it
runs on all of them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import orjson

MODEL = "all-MiniLM-L6-v2"
DIM = 384
#: int8 ONNX vs the fp32 sentence-transformers reference (MODELS.md: ≈ 0.9996)
MIN_COSINE = 0.99


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: Any = None  # a JSON value, or raw bytes sent as they are
    status: int = 200
    error_code: str | None = None
    check: Callable[[Any, Callable[[list[str]], np.ndarray]], None] | None = field(default=None, compare=False)

    def payload(self) -> bytes | None:
        if self.body is None:
            return None
        return self.body if isinstance(self.body, bytes) else orjson.dumps(self.body)


def _vectors(doc: dict) -> np.ndarray:
    rows = []
    for item in doc["data"]:
        emb = item["embedding"]
        rows.append(np.frombuffer(base64.b64decode(emb), "<f4") if isinstance(emb, str) else np.asarray(emb, "f4"))
    return np.stack(rows)


def _check_embeddings(texts: list[str], *, dims: int = DIM):
    def check(doc: dict, reference: Callable[[list[str]], np.ndarray]) -> None:
        assert doc["object"] == "list" and doc["model"] == MODEL
        assert [d["index"] for d in doc["data"]] == list(range(len(texts)))
        assert all(d["object"] == "embedding" for d in doc["data"])
        vectors = _vectors(doc)
        assert vectors.shape == (len(texts), dims)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        ref = reference(texts)[:, :dims]
        ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        cosines = (vectors * ref).sum(axis=1)
        assert cosines.min() > MIN_COSINE, cosines
        assert doc["usage"]["prompt_tokens"] == doc["usage"]["total_tokens"] > 2 * len(texts)

    return check


def _check_models(doc: dict, reference) -> None:
    assert doc["object"] == "list"
    ids = [m["id"] for m in doc["data"]]
    assert ids == [MODEL]
    assert "embeddings" in doc["data"][0]["capabilities"]


def _check_health(doc: dict, reference) -> None:
    assert doc == {"status": "ok"}


THREE = ["The cat sits on the mat.", "A feline rests on a rug.", "Stock markets fell sharply on Tuesday."]

CASES: list[Case] = [
    Case("embed-one-string", "POST", "/v1/embeddings", {"input": "How do I reset my password?", "model": MODEL},
         check=_check_embeddings(["How do I reset my password?"])),
    Case("embed-list-no-model", "POST", "/v1/embeddings", {"input": THREE}, check=_check_embeddings(THREE)),
    Case("embed-base64", "POST", "/v1/embeddings", {"input": THREE, "encoding_format": "base64"},
         check=_check_embeddings(THREE)),
    Case("embed-dimensions", "POST", "/v1/embeddings", {"input": THREE, "dimensions": 128},
         check=_check_embeddings(THREE, dims=128)),
    Case("embed-empty-list", "POST", "/v1/embeddings", {"input": []}, status=400, error_code="invalid_input"),
    Case("embed-wrong-type", "POST", "/v1/embeddings", {"input": 5}, status=422, error_code="validation_error"),
    Case("embed-unknown-model", "POST", "/v1/embeddings", {"input": "x", "model": "nope"}, status=404,
         error_code="model_not_found"),
    Case("embed-invalid-json", "POST", "/v1/embeddings", b'{"input": ', status=400, error_code="invalid_json"),
    Case("embed-too-many-inputs", "POST", "/v1/embeddings", {"input": ["a"] * 2049}, status=413,
         error_code="too_large"),
    Case("embed-dimensions-too-big", "POST", "/v1/embeddings", {"input": "x", "dimensions": 4096}, status=400,
         error_code="invalid_input"),
    Case("unknown-route", "POST", "/v1/nope", {"input": "x"}, status=404, error_code="not_found"),
    Case("models", "GET", "/v1/models", check=_check_models),
    Case("health", "GET", "/health", check=_check_health),
]


def run_case(case: Case, send: Callable[[Case], Reply], reference: Callable[[list[str]], np.ndarray]) -> None:
    reply = send(case)
    assert reply.status == case.status, (reply.status, reply.body[:500])
    assert reply.headers.get("content-type", "").startswith("application/json"), reply.headers
    doc = reply.json()
    if case.status >= 400:
        assert set(doc) == {"error"}, doc
        assert set(doc["error"]) == {"message", "type", "param", "code"}, doc
        assert doc["error"]["code"] == case.error_code, doc
        assert doc["error"]["message"]
    if case.check is not None:
        case.check(doc, reference)
