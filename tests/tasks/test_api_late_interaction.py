"""Multi-vector output over HTTP (in-process app): /v1/embeddings returns a list of vectors per input (float,
or one base64 string per vector), /v1/score computes MaxSim server-side."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import ModelSpec, Settings
from core.tasks.embed import EmbedRequest
from core.tasks.late_interaction import MaxSimRequest
from tests.support.engines import load_engine

QUERY = "who wrote the theory of relativity?"
DOCS = ["Albert Einstein published the theory of relativity.", "Bananas grow in tropical climates."]


@pytest.fixture(scope="module")
def client(colbert_dir):
    settings = Settings(models=[ModelSpec(path=colbert_dir, name="colbert")], threads=2)
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(scope="module")
def engine(colbert_dir):
    return load_engine(colbert_dir)


def test_multi_vector_float(client, engine):
    r = client.post("/v1/embeddings", json={"model": "colbert", "input": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    ref = engine.run_sync(EmbedRequest(texts=DOCS)).vectors
    for item, vecs in zip(body["data"], ref):
        got = np.array(item["embedding"], dtype=np.float32)
        assert got.shape == vecs.shape and got.shape[1] == 16
        np.testing.assert_allclose(got, vecs, atol=1e-5)
    assert body["usage"]["prompt_tokens"] > 0


def test_multi_vector_base64_query(client, engine):
    r = client.post("/v1/embeddings", json={"model": "colbert", "input": QUERY, "encoding_format": "base64",
                                            "input_type": "query"})
    assert r.status_code == 200, r.text
    strings = r.json()["data"][0]["embedding"]
    got = np.stack([np.frombuffer(base64.b64decode(s), "<f4") for s in strings])
    np.testing.assert_allclose(got, engine.run_sync(EmbedRequest(texts=[QUERY], input_type="query")).vectors[0], atol=1e-6)


def test_score_route(client, engine):
    r = client.post("/v1/score", json={"model": "colbert", "query": QUERY, "documents": [{"text": d} for d in DOCS]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    ref = engine.run_sync(MaxSimRequest(QUERY, DOCS)).scores
    np.testing.assert_allclose([d["score"] for d in body["data"]], ref, atol=1e-4)


def test_bad_input(client):
    r = client.post("/v1/score", json={"model": "colbert", "query": QUERY, "documents": []})
    assert r.status_code == 400 and "documents" in r.json()["error"]["message"]
    r = client.post("/v1/embeddings", json={"model": "colbert", "input": "x", "dimensions": 8})
    assert r.status_code == 400 and "dimensions" in r.json()["error"]["message"]
    r = client.post("/v1/rerank", json={"model": "colbert", "query": "q", "documents": ["d"]})
    assert r.status_code == 400 and "score" in r.json()["error"]["message"]
