"""HTTP tests of the Infinity-style and TEI-style routes with the peers' documented field names, against the
real server on loopback; plus bad input for each task (400 with a clear message, never 500)."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

QUERY = "How many people live in Berlin?"
DOCS = [
    "Berlin has a population of 3.5 million registered inhabitants.",
    "The capital of France is Paris.",
    "Cats sleep most of the day.",
]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def ce_scores(reranker_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(reranker_dir), device="cpu").predict([(QUERY, d) for d in DOCS])


def ok(response: httpx.Response):
    assert response.status_code == 200, response.text
    return response.json()


def error(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body["message"]


# --- Infinity shapes ------------------------------------------------------------------------------------

def test_infinity_embeddings(http, st_minilm):
    body = ok(http.post("/embeddings", json={"model": "minilm", "input": ["hello world"], "encoding_format": "float"}))
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(body["data"][0]["embedding"], st_minilm.encode(["hello world"])[0], atol=1e-5)


def test_infinity_rerank(http, ce_scores):
    body = ok(http.post("/rerank", json={
        "model": "reranker", "query": QUERY, "documents": DOCS, "return_documents": True, "top_n": 2,
    }))
    assert body["object"] == "rerank" and body["model"] == "reranker"
    order = np.argsort(-ce_scores, kind="stable")[:2].tolist()
    assert [r["index"] for r in body["results"]] == order
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(float(ce_scores[r["index"]]), abs=1e-5)
        assert r["document"] == DOCS[r["index"]]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_v1_rerank_document_objects_and_raw_scores(http, ce_scores):
    docs = [{"text": d, "id": i} for i, d in enumerate(DOCS)]
    body = ok(http.post("/v1/rerank", json={"query": QUERY, "documents": docs, "return_documents": True,
                                           "raw_scores": True, "model": "reranker"}))
    logits = np.log(ce_scores / (1 - ce_scores))
    for r in body["results"]:
        assert r["document"] == docs[r["index"]]
        assert r["relevance_score"] == pytest.approx(float(logits[r["index"]]), abs=1e-4)
    assert len(body["results"]) == len(DOCS)


def test_infinity_classify(http):
    body = ok(http.post("/classify", json={"model": "classifier", "input": ["I love it", "I hate it"]}))
    assert body["object"] == "classify" and len(body["data"]) == 2
    for row in body["data"]:
        assert {d["label"] for d in row} == {"negative", "neutral", "positive"}
        scores = [d["score"] for d in row]
        assert scores == sorted(scores, reverse=True) and sum(scores) == pytest.approx(1.0, abs=1e-5)
    top = ok(http.post("/v1/classify", json={"model": "classifier", "input": "I love it", "top_k": 1}))
    assert len(top["data"][0]) == 1 and top["data"][0][0]["label"] == body["data"][0][0]["label"]
    assert top["data"][0][0]["score"] == pytest.approx(body["data"][0][0]["score"], abs=1e-5)
    only = ok(http.post("/v1/classify", json={"model": "classifier", "input": "x", "labels": ["positive"]}))
    assert [d["label"] for d in only["data"][0]] == ["positive"]


def test_infinity_models(http):
    body = ok(http.get("/models"))
    cards = {m["id"]: m for m in body["data"]}
    assert cards["reranker"]["capabilities"] == ["rerank", "tokenize"]
    assert cards["classifier"]["labels"] == ["negative", "neutral", "positive"]
    assert "embeddings_sparse" in cards["splade"]["capabilities"]
    assert "embeddings" in cards["minilm"]["capabilities"] and "query" in cards["minilm"]["prompts"]


# --- sparse and tokenize ----------------------------------------------------------------------------

def test_sparse_embeddings_route(http):
    body = ok(http.post("/v1/embeddings/sparse", json={"model": "splade", "input": ["capital of Germany"],
                                                      "return_tokens": True}))
    emb = body["data"][0]["embedding"]
    assert body["data"][0]["object"] == "sparse_embedding"
    assert len(emb["indices"]) == len(emb["values"]) == len(emb["tokens"]) > 0
    assert emb["indices"] == sorted(emb["indices"]) and min(emb["values"]) > 0
    assert "germany" in emb["tokens"]
    assert body["usage"]["prompt_tokens"] == 5  # [CLS] capital of germany [SEP]


def test_v1_tokenize(http):
    body = ok(http.post("/v1/tokenize", json={"model": "minilm", "input": ["Hello, world!", "a"]}))
    first = body["data"][0]
    assert first["tokens"] == ["[CLS]", "hello", ",", "world", "!", "[SEP]"]
    assert first["ids"][0] == 101 and first["count"] == 6
    assert body["max_length"] == 256 and body["usage"]["prompt_tokens"] == 9
    bare = ok(http.post("/v1/tokenize", json={"model": "reranker", "input": "a", "add_special_tokens": False}))
    assert bare["data"][0]["tokens"] == ["a"]


# --- TEI shapes ---------------------------------------------------------------------------------------

def test_tei_embed(http, st_minilm):
    body = ok(http.post("/embed", json={"inputs": ["hello world", "bye"], "normalize": True, "truncate": True}))
    np.testing.assert_allclose(np.array(body), st_minilm.encode(["hello world", "bye"]), atol=1e-5)
    single = ok(http.post("/embed", json={"inputs": "hello world", "prompt_name": "query"}))
    assert len(single) == 1 and len(single[0]) == 384


def test_tei_rerank(http, ce_scores):
    body = ok(http.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}))
    assert [r["index"] for r in body] == np.argsort(-ce_scores, kind="stable").tolist()
    for r in body:
        assert set(r) == {"index", "score", "text"} and r["text"] == DOCS[r["index"]]
        assert r["score"] == pytest.approx(float(ce_scores[r["index"]]), abs=1e-5)
    raw = ok(http.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}))
    assert "text" not in raw[0] and min(r["score"] for r in raw) < 0 or max(r["score"] for r in raw) > 1


def test_tei_embed_sparse(http):
    body = ok(http.post("/embed_sparse", json={"inputs": ["capital of Germany", "dogs"]}))
    assert len(body) == 2
    assert all(set(x) == {"index", "value"} and x["value"] > 0 for x in body[0])
    ours = ok(http.post("/v1/embeddings/sparse", json={"input": "capital of Germany"}))["data"][0]["embedding"]
    assert [x["index"] for x in body[0]] == ours["indices"]


def test_tei_predict(http):
    single = ok(http.post("/predict", json={"inputs": "I love it"}))
    assert isinstance(single, list) and set(single[0]) == {"score", "label"} and len(single) == 3
    batch = ok(http.post("/predict", json={"inputs": [["I love it"], ["I hate it"]]}))
    assert len(batch) == 2 and [d["label"] for d in batch[0]] == [d["label"] for d in single]
    pair = ok(http.post("/predict", json={"inputs": ["A man eats.", "Someone is eating."], "raw_scores": True}))
    assert len(pair) == 3 and isinstance(pair[0]["score"], float)
    texts = ok(http.post("/predict", json={"inputs": ["one", "two", "three"]}))
    assert len(texts) == 3 and all(len(row) == 3 for row in texts)


def test_tei_tokenize(http):
    body = ok(http.post("/tokenize", json={"inputs": "Hello, world!"}))
    assert body[0][0] == {"id": 101, "text": "[CLS]", "special": True, "start": 0, "stop": 0}
    assert body[0][1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    assert len(ok(http.post("/tokenize", json={"inputs": ["a", "b c"], "add_special_tokens": False}))[1]) == 2


def test_tei_info(http):
    info = ok(http.get("/info"))
    for key in ("model_id", "model_dtype", "model_type", "max_input_length", "max_batch_tokens",
                "max_client_batch_size", "version"):
        assert key in info
    assert isinstance(info["tokenization_workers"], int) and info["tokenization_workers"] >= 1
    reranker = ok(http.get("/info", params={"model": "reranker"}))
    assert "reranker" in reranker["model_type"]
    assert "classifier" in ok(http.get("/info", params={"model": "classifier"}))["model_type"]


# --- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
def test_rerank_empty_documents(http, path):
    assert "documents" in error(http.post(path, json={"model": "reranker", "query": QUERY, "documents": []}))


@pytest.mark.parametrize("top_n", [0, -1])
def test_rerank_top_n_not_positive(http, top_n):
    msg = error(http.post("/v1/rerank", json={"model": "reranker", "query": QUERY, "documents": DOCS, "top_n": top_n}))
    assert "top_n" in msg


def test_rerank_bad_documents(http):
    assert "documents" in error(http.post("/v1/rerank", json={"model": "reranker", "query": QUERY}))
    msg = error(http.post("/v1/rerank", json={"model": "reranker", "query": QUERY, "documents": [{"title": "x"}]}))
    assert "text" in msg
    assert "texts" in error(http.post("/rerank", json={"query": QUERY, "texts": []}))


def test_classify_bad_input(http):
    assert "labels" in error(http.post("/v1/classify", json={"model": "classifier", "input": "x", "labels": ["happy"]}))
    assert "top_k" in error(http.post("/v1/classify", json={"model": "classifier", "input": "x", "top_k": 0}))
    assert "input" in error(http.post("/v1/classify", json={"model": "classifier", "input": []}))
    assert "inputs" in error(http.post("/predict", json={"inputs": []}))


@pytest.mark.parametrize("path,body,capabilities", [
    ("/v1/rerank", {"model": "minilm", "query": "q", "documents": ["d"]}, "embeddings"),
    ("/v1/classify", {"model": "reranker", "input": "x"}, "rerank"),
    ("/v1/embeddings/sparse", {"model": "minilm", "input": "x"}, "embeddings"),
    ("/v1/embeddings", {"model": "splade", "input": "x"}, "embeddings_sparse"),
    ("/v1/score", {"model": "minilm", "query": "q", "documents": ["d"]}, "embeddings"),
])
def test_task_the_model_lacks(http, path, body, capabilities):
    msg = error(http.post(path, json=body))
    assert body["model"] in msg and capabilities in msg and "tokenize" in msg


def test_sparse_and_tokenize_bad_input(http):
    assert "input" in error(http.post("/v1/embeddings/sparse", json={"model": "splade", "input": []}))
    assert "input" in error(http.post("/v1/tokenize", json={"model": "minilm", "input": []}))


def test_base64_embeddings_still_work(http):
    body = ok(http.post("/v1/embeddings", json={"model": "minilm", "input": "x", "encoding_format": "base64"}))
    assert np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), "<f4").shape == (384,)
