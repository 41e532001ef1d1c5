"""Drop-in: the peers' own client packages, unchanged except their base URL, against a real server on
loopback (Infinity's generated client, huggingface_hub's InferenceClient for TEI, Cohere's embed,
LangChain's OpenAIEmbeddings), and the TEI route details their users rely on."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

QUERY = "How many people live in Berlin?"
DOCS = ["Berlin has a population of 3.5 million registered inhabitants.", "The capital of France is Paris.",
        "Cats sleep most of the day."]
TEXTS = ["The quick brown fox.", "Ein Satz auf Deutsch."]


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server, timeout=60) as client:
        yield client


def ok(response: httpx.Response):
    assert response.status_code == 200, response.text
    return response.json()


def err(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


# --- Infinity's own client ----------------------------------------------------------------------------------

def test_infinity_client_models_embeddings_rerank_classify(server, st_minilm, reranker_dir):
    from infinity_client import Client
    from infinity_client.api.default import classify, embeddings, models, rerank
    from infinity_client.models import ClassifyInput, OpenAIEmbeddingInputText, RerankInput
    from sentence_transformers import CrossEncoder

    client = Client(base_url=server, raise_on_unexpected_status=True)
    listed = models.sync(client=client)
    assert {m.id for m in listed.data} == {"minilm", "reranker", "classifier", "splade"}
    # the client sends dimensions: 0 ("off") and its own model default unless told otherwise
    got = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS, model="minilm"))
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), st_minilm.encode(TEXTS), atol=1e-5)
    ranked = rerank.sync(client=client, body=RerankInput(query=QUERY, documents=DOCS, model="reranker",
                                                           return_documents=True))
    ref = CrossEncoder(str(reranker_dir), device="cpu").predict([(QUERY, d) for d in DOCS])
    assert [r.index for r in ranked.results] == np.argsort(-ref, kind="stable").tolist()
    assert ranked.results[0].document == DOCS[ranked.results[0].index]
    for r in ranked.results:
        assert r.relevance_score == pytest.approx(float(ref[r.index]), abs=1e-5)
    labels = classify.sync(client=client, body=ClassifyInput(input_=TEXTS, model="classifier"))
    assert len(labels.data) == 2 and all(abs(sum(o.score for o in row) - 1) < 1e-5 for row in labels.data)


def test_infinity_client_default_model_with_one_model_served(minilm_onnx_dir, st_minilm):
    """With no model named, Infinity's client sends model 'default/not-specified': the one served answers."""
    import json

    from infinity_client import Client
    from infinity_client.api.default import embeddings
    from infinity_client.models import OpenAIEmbeddingInputText

    from tests.support.server import running_server

    models = [{"path": str(minilm_onnx_dir), "name": "only"}]
    with running_server({"TESSERA_MODELS": json.dumps(models), "TESSERA_THREADS": "2"}) as base:
        client = Client(base_url=base, raise_on_unexpected_status=True)
        got = embeddings.sync(client=client, body=OpenAIEmbeddingInputText(input_=TEXTS))
    assert got.model == "only"
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), st_minilm.encode(TEXTS), atol=1e-4)


# --- TEI through huggingface_hub's InferenceClient ----------------------------------------------------------

def test_inference_client_feature_extraction_similarity_classification(server, st_minilm, monkeypatch):
    from huggingface_hub import InferenceClient, constants

    # the test environment is offline for the Hub; this client talks to the loopback server only
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    embedder = InferenceClient(base_url=server + "/?model=minilm")
    vectors = embedder.feature_extraction(TEXTS[0])
    np.testing.assert_allclose(np.asarray(vectors)[0], st_minilm.encode(TEXTS[0]), atol=1e-5)
    scores = embedder.sentence_similarity(TEXTS[0], other_sentences=[TEXTS[0], TEXTS[1]])
    ref = st_minilm.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(scores, [1.0, float(ref[0] @ ref[1])], atol=1e-5)
    classifier = InferenceClient(base_url=server + "/?model=classifier")
    labels = classifier.text_classification("A text to classify.")
    assert labels and abs(sum(x.score for x in labels) - 1) < 1e-5 and all(x.label for x in labels)


# --- TEI route details ---------------------------------------------------------------------------------------

def test_tei_embed_takes_token_ids_and_truncation_direction(http, st_minilm):
    ids = ok(http.post("/tokenize?model=minilm", json={"inputs": TEXTS[0]}))[0]
    by_ids = ok(http.post("/embed?model=minilm", json={"inputs": [t["id"] for t in ids]}))
    np.testing.assert_allclose(by_ids[0], st_minilm.encode(TEXTS[0]), atol=1e-5)
    long_text = "start " * 300 + "the very end of a long text"
    right = np.array(ok(http.post("/embed?model=minilm", json={"inputs": long_text})))[0]
    left = np.array(ok(http.post("/embed?model=minilm", json={"inputs": long_text, "truncation_direction": "Left"})))[0]
    tokenizer = st_minilm.tokenizer
    kept = tokenizer.decode(tokenizer(long_text, add_special_tokens=False)["input_ids"][-254:])
    np.testing.assert_allclose(left, st_minilm.encode(kept), atol=1e-4)  # the end kept, not the start
    np.testing.assert_allclose(right, st_minilm.encode(long_text), atol=1e-5)
    assert "pairs" in err(http.post("/predict?model=classifier", json={"inputs": [["a", "b"]],
                                                                       "truncation_direction": "Left"}), 400)["message"]
    assert err(http.post("/rerank?model=reranker", json={"query": "q", "texts": ["d"], "truncation_direction": "Left"}),
               400)["param"] == "truncation_direction"


def test_tei_embed_all_similarity_decode(http, minilm_dir):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    model = AutoModel.from_pretrained(str(minilm_dir)).eval()
    with torch.inference_mode():
        hidden = model(**tokenizer(TEXTS[1], return_tensors="pt")).last_hidden_state[0].numpy()
    got = np.array(ok(http.post("/embed_all?model=minilm", json={"inputs": [TEXTS[1]]}))[0])
    assert got.shape == hidden.shape
    np.testing.assert_allclose(got, hidden, atol=1e-4)
    scores = ok(http.post("/similarity?model=minilm", json={"inputs": {"source_sentence": TEXTS[0],
                                                                       "sentences": [TEXTS[0], TEXTS[1]]}}))
    assert len(scores) == 2 and scores[0] == pytest.approx(1.0, abs=1e-5) and scores[1] < 0.9
    ids = tokenizer(TEXTS[0])["input_ids"]
    assert ok(http.post("/decode?model=minilm", json={"ids": ids})) == [tokenizer.decode(ids, skip_special_tokens=True)]
    both = ok(http.post("/decode?model=minilm", json={"ids": [ids, ids], "skip_special_tokens": False}))
    assert both == [tokenizer.decode(ids)] * 2
    assert err(http.post("/decode?model=minilm", json={"ids": [10**7]}), 400)["code"] == "invalid_token_id"
    assert err(http.post("/embed_all?model=splade", json={"inputs": "x"}), 400)["code"] == "unsupported_task"


def test_tei_prompt_name_on_sparse_and_tokenize(http):
    plain = ok(http.post("/tokenize?model=minilm", json={"inputs": "berlin"}))[0]
    prompted = ok(http.post("/tokenize?model=minilm", json={"inputs": "berlin", "prompt_name": "query"}))[0]
    assert len(prompted) > len(plain) and prompted[-2]["text"] == plain[-2]["text"]
    assert err(http.post("/embed_sparse?model=splade", json={"inputs": "x", "prompt_name": "nope"}), 400)["code"] == (
        "unknown_prompt")


def test_tei_routes_say_how_to_choose_a_model(minilm_onnx_dir):
    from tests.api.conftest import client_for

    models = [{"path": str(minilm_onnx_dir), "name": "a"}, {"path": str(minilm_onnx_dir), "name": "b"}]
    with client_for(models=models) as client:
        message = err(client.post("/embed", json={"inputs": "x"}), 404)["message"]
        assert "?model=NAME" in message and "X-Model" in message
        assert len(ok(client.post("/embed", json={"inputs": "x"}, headers={"X-Model": "b"}))[0]) == 384
        assert len(ok(client.post("/embed?model=a", json={"inputs": "x"}))[0]) == 384


# --- Cohere's embed, LangChain, curl-style bodies ------------------------------------------------------------

def test_cohere_v2_embed_by_types(server, st_minilm):
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=server)
    response = client.embed(model="minilm", texts=TEXTS, input_type="search_document",
                            embedding_types=["float", "int8", "base64"])
    floats = np.array(response.embeddings.float_)
    np.testing.assert_allclose(floats, st_minilm.encode(TEXTS), atol=1e-5)
    decoded = np.stack([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in response.embeddings.base64])
    np.testing.assert_allclose(decoded, floats, atol=1e-7)
    raw = httpx.post(server + "/v1/embeddings", json={"model": "minilm", "input": TEXTS, "embedding_type": "int8"},
                     timeout=60).json()
    assert response.embeddings.int8 == [d["embedding"] for d in raw["data"]]
    assert response.texts == TEXTS and response.meta.billed_units.input_tokens > 0
    with pytest.raises(cohere.core.api_error.ApiError) as caught:
        client.embed(model="minilm", texts=TEXTS, input_type="search_query", embedding_types=["float"],
                     max_tokens=8)
    assert caught.value.status_code == 400


def test_cohere_v1_client_embed(server, st_minilm):
    """The v1 client's ``co.embed``: POST /v1/embed; without embedding_types, v1's embeddings_floats."""
    import cohere

    client = cohere.Client(api_key="unused", base_url=server)
    response = client.embed(texts=TEXTS, model="minilm", input_type="search_document")
    assert response.response_type == "embeddings_floats" and response.texts == TEXTS
    np.testing.assert_allclose(np.array(response.embeddings), st_minilm.encode(TEXTS), atol=1e-5)
    typed = client.embed(texts=TEXTS, model="minilm", input_type="search_query", embedding_types=["float", "int8"])
    assert typed.response_type == "embeddings_by_type"
    np.testing.assert_allclose(np.array(typed.embeddings.float_), st_minilm.encode(TEXTS), atol=1e-5)
    assert len(typed.embeddings.int8[0]) == len(typed.embeddings.float_[0])
    with pytest.raises(cohere.core.api_error.ApiError) as caught:
        client.embed(texts=TEXTS, model="no-such-model", input_type="search_document")
    assert caught.value.status_code == 404


def test_root_with_several_models_and_none_named_names_the_way_to_choose(http):
    """POST / (TEI / Hugging Face Inference) on a server of four models: an error that says how to name one,
    not a schema error of whichever model happens to come first."""
    got = err(http.post("/", json={"inputs": TEXTS}), 404)
    assert "X-Model" in got["message"] and "?model=NAME" in got["message"] and got["param"] == "model"
    assert "query" not in got["message"]  # not the reranker's schema
    named = ok(http.post("/", json={"inputs": TEXTS}, headers={"X-Model": "minilm"}))
    assert len(named) == 2 and len(named[0]) == 384


def test_langchain_openai_embeddings(server, st_minilm):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model="minilm", base_url=server + "/v1", api_key="unused",
                                  check_embedding_ctx_length=False)
    np.testing.assert_allclose(np.array(embeddings.embed_documents(TEXTS)), st_minilm.encode(TEXTS), atol=1e-5)
    np.testing.assert_allclose(embeddings.embed_query(TEXTS[0]), st_minilm.encode(TEXTS[0]), atol=1e-5)


def test_foreign_token_ids_are_refused_with_the_fix(http):
    """What LangChain's default sends: OpenAI (tiktoken cl100k) ids, most beyond a BERT vocabulary. Its
    tokenizer file cannot be fetched offline, so the ids are sent here as it would send them."""
    error = err(http.post("/v1/embeddings", json={"model": "minilm", "input": [[791, 4062, 14198, 39935, 100255]]}),
                400)
    assert error["code"] == "invalid_token_id" and "check_embedding_ctx_length=False" in error["message"]


def test_json_sent_as_form_data_is_read_as_json(http):
    """``curl -d '{...}'`` sends application/x-www-form-urlencoded; the body is JSON all the same."""
    body = '{"model": "minilm", "input": "curl without a content type"}'
    got = ok(http.post("/v1/embeddings", content=body,
                       headers={"Content-Type": "application/x-www-form-urlencoded"}))
    assert len(got["data"][0]["embedding"]) == 384
    error = err(http.post("/v1/embeddings", content=b"input=x", headers={"Content-Type": "multipart/form-data"}), 400)
    assert "Content-Type: application/json" in error["message"]
