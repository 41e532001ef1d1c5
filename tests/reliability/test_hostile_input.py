"""Bad bytes and loose types never cost a 500 or a silently different answer: lone surrogates, token ids
past int64, bodies that are not parseable JSON, and values that only coercion would make valid. Each
answer is a 4xx in the error shape naming what is wrong, and the app keeps serving."""

from __future__ import annotations

import gzip

import pytest

from tests.api.conftest import assert_error, client_for
from tests.support.tokenizer_work import counting_tokenizer

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def client(minilm_dir, reranker_dir, classifier_dir, splade_dir, colbert_dir):
    models = [
        {"path": str(minilm_dir), "name": "minilm", "backend": "torch"},
        {"path": str(reranker_dir), "name": "reranker", "backend": "torch"},
        {"path": str(classifier_dir), "name": "classifier", "backend": "torch"},
        {"path": str(splade_dir), "name": "splade", "backend": "torch"},
        {"path": str(colbert_dir), "name": "colbert", "backend": "torch"},
    ]
    with client_for(models=models) as c:
        yield c


def _still_serving(client):
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": "still here"})
    assert response.status_code == 200, response.text


LONE = "a\\ud800b"  # a JSON escape of a lone surrogate: valid JSON syntax, not valid Unicode text

SURROGATE_BODIES = [
    ("/v1/embeddings", f'{{"model": "minilm", "input": "{LONE}"}}', "input[0]"),
    ("/v1/embeddings", f'{{"model": "minilm", "input": ["ok", "{LONE}"]}}', "input[1]"),
    ("/v1/embeddings", f'{{"model": "minilm", "input": "x", "prompt": "{LONE}"}}', "prompt[0]"),
    ("/v1/embeddings/sparse", f'{{"model": "splade", "input": "{LONE}"}}', "input[0]"),
    ("/v1/rerank", f'{{"model": "reranker", "query": "{LONE}", "documents": ["a"]}}', "query[0]"),
    ("/v1/rerank", f'{{"model": "reranker", "query": "q", "documents": ["a", "{LONE}"]}}', "documents[1]"),
    ("/v2/rerank", f'{{"model": "reranker", "query": "q", "documents": ["{LONE}"]}}', "documents[0]"),
    ("/v1/classify", f'{{"model": "classifier", "input": ["{LONE}"]}}', "input[0]"),
    ("/v1/score", f'{{"model": "colbert", "query": "{LONE}", "documents": ["a"]}}', "input[0]"),
    ("/v1/tokenize", f'{{"model": "minilm", "input": "{LONE}"}}', "input[0]"),
]


@pytest.mark.parametrize("path, body, where", SURROGATE_BODIES)
def test_a_lone_surrogate_is_a_400_on_every_text_route(client, path, body, where):
    response = client.post(path, content=body.encode(), headers=JSON)
    assert_error(response, 400, "invalid_text")
    assert where in response.json()["error"]["message"]
    _still_serving(client)


def test_tei_embed_surrogate(minilm_dir):
    """TEI's /embed carries no model field: a one-model app serves it."""
    with client_for(models=[{"path": str(minilm_dir), "name": "minilm", "backend": "torch"}]) as one:
        response = one.post("/embed", content=f'{{"inputs": "{LONE}"}}'.encode(), headers=JSON)
        assert_error(response, 400, "invalid_text")


@pytest.mark.parametrize("ids", ["[101, 9223372036854775808, 102]", "[18446744073709551615]", "[-1]", "[30522]"])
def test_token_ids_outside_the_vocabulary_are_400(client, ids):
    response = client.post("/v1/embeddings", content=f'{{"model": "minilm", "input": [{ids}]}}'.encode(),
                           headers=JSON)
    assert_error(response, 400, "invalid_token_id")
    _still_serving(client)


@pytest.mark.parametrize("name, body, headers", [
    ("invalid UTF-8", b'{"input": "\xff\xfe"}', JSON),
    ("5000-digit integer", b'{"input": ' + b"9" * 5000 + b"}", JSON),
    ("nesting past the recursion limit", b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON),
    ("gzip body", gzip.compress(b'{"input": "hello"}'), {**JSON, "content-encoding": "gzip"}),
    ("truncated JSON", b'{"input": "hel', JSON),
])
def test_bodies_that_do_not_parse_are_invalid_json_400(client, name, body, headers):
    response = client.post("/v1/embeddings", content=body, headers=headers)
    assert_error(response, 400, "invalid_json")
    assert response.json()["error"]["type"] == "invalid_request_error"
    _still_serving(client)


def test_nesting_that_parses_is_a_schema_error_not_a_500(client):
    response = client.post("/v1/embeddings", content=b'{"input": ' + b"[" * 900 + b"]" * 900 + b"}", headers=JSON)
    assert response.status_code in (400, 422), response.text
    _still_serving(client)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": True}, "dimensions"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": "32"}, "dimensions"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "normalize": "yes"}, "normalize"),
    ("/v1/embeddings", {"model": "minilm", "input": "x", "truncate": 0}, "truncate"),
    ("/v1/embeddings", {"model": "minilm", "input": [True, False]}, "input"),
    ("/v1/embeddings", {"model": "minilm", "input": [[101, 2.5, 102]]}, "input"),
    ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a"], "top_n": "1"}, "top_n"),
    ("/v1/classify", {"model": "classifier", "input": "x", "raw_scores": "true"}, "raw_scores"),
])
def test_values_are_not_coerced(client, path, body, param):
    response = client.post(path, json=body)
    assert_error(response, 422, "validation_error")
    assert response.json()["error"]["param"].startswith(param)


def test_correctly_typed_values_still_work(client):
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": [[101, 7592, 102]], "dimensions": 32,
                                                   "normalize": True, "truncate": True})
    assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 32


def test_a_huge_prompt_counts_toward_the_character_limits(client):
    """{"input": ["x"] * 2048, "prompt": "word " * 40000} (a 210 KB body) drove a server to 14 GB and past 120 s."""
    import time

    started = time.monotonic()
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": ["x"] * 2048, "prompt": "word " * 40000})
    assert_error(response, 413)
    assert response.json()["error"]["param"] == "prompt"
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": ["x"] * 256, "prompt": "word " * 19000})
    assert_error(response, 413)  # each item fits, the request does not: 256 × 95k characters
    assert time.monotonic() - started < 2.0
    _still_serving(client)


def test_a_prompt_longer_than_the_window_is_tokenized_once_with_the_same_tokens(client, minilm_dir):
    """Allowed: a 60k-character prompt over 64 texts. Every text's window is the prompt's first tokens,
    exactly as when each prompt + text is tokenized whole (checked here against the tokenizer itself).
    The work is counted, not timed: the characters handed to the tokenizer stay a few prompts' worth
    (once per text was 64 prompts' worth), however busy the machine is."""
    from core.tokenization import TextTokenizer

    from core.tasks.embed import EmbedRequest

    prompt, texts = "word " * 12_000, [f"text {i}" for i in range(64)]
    task = client.app.state.registry.engines["minilm"].task
    with counting_tokenizer(task.tokenizer) as work:
        items = task.prepare(EmbedRequest(texts=texts, prompt=prompt))
    assert len(items) == 64
    assert not any(t.startswith(prompt) and t != prompt for t in work.texts), "the prompt was tokenized with a text"
    assert work.chars <= 4 * len(prompt), f"{work.chars} characters tokenized for a {len(prompt)}-character prompt"
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": texts, "prompt": prompt})
    assert response.status_code == 200, response.text
    tokenizer = TextTokenizer(minilm_dir, 256)
    whole = tokenizer.encode([prompt + texts[0], prompt + texts[-1]])
    assert (whole[0].ids == whole[1].ids).all() and response.json()["usage"]["prompt_tokens"] == 64 * whole[0].cost
    vectors = [d["embedding"] for d in response.json()["data"]]
    assert vectors[0] == vectors[-1]
    refused = client.post("/v1/embeddings", json={"model": "minilm", "input": texts, "prompt": prompt, "truncate": False})
    assert_error(refused, 413, "input_too_long")


@pytest.mark.parametrize("keys", ['["k", ""]', '["  "]', '[""]'])
def test_an_empty_api_key_is_a_start_up_error(keys, monkeypatch):
    """'["$KEY"]' with KEY unset used to switch authentication off for requests without credentials."""
    from pydantic import ValidationError

    from core.config import Settings

    monkeypatch.setenv("TESSERA_API_KEYS", keys)
    with pytest.raises(ValidationError, match=r"api_keys\[\d\] is empty or blank"):
        Settings()


def test_tokenize_has_the_limits_of_the_other_routes(minilm_dir):
    """/v1/tokenize with an 8.3 MB body reached 1.9 GB and ran on after the client left: it now stops at
    the tokens-per-request limit (413) and at the deadline (504), like the other routes. The refusal is
    checked by the work done (the texts tokenized before it), not by a time that a busy machine stretches."""
    texts = ["word " * 20_000] * 80  # 8 MB, 1.6M tokens
    with client_for(models=[{"path": str(minilm_dir), "name": "m", "backend": "torch"}],
                    max_request_bytes=16 << 20) as one:
        tokenizer = one.app.state.registry.engines["m"].task.tokenizer
        limit = one.app.state.settings.max_tokens_per_request
        for path, key in (("/v1/tokenize", "input"), ("/tokenize", "inputs")):
            with counting_tokenizer(tokenizer) as work:
                response = one.post(path, json={key: texts})
            assert_error(response, 413, "too_many_tokens")
            # stopped once the running total passed the limit: not every text was tokenized
            assert 0 < len(work.texts) < len(texts), f"{len(work.texts)} of {len(texts)} texts tokenized before the 413"
            assert work.chars < 3 * limit * len("word "), f"{work.chars} characters tokenized before the 413"
        response = one.post("/v1/tokenize", json={"input": ["word " * 20_000] * 12},
                            headers={"X-Request-Timeout": "0.05"})
        assert_error(response, 504)
        assert one.post("/v1/tokenize", json={"input": "fine"}).json()["data"][0]["count"] == 3


def test_a_multi_vector_answer_is_bounded_by_the_response_limit(colbert_dir):
    """A vector per token: the answer grows with the tokens, so it is counted (values × 8 bytes, low)
    against max_response_bytes before any inference; a score request answers one number per document."""
    with client_for(models=[{"path": str(colbert_dir), "name": "colbert", "backend": "torch"}],
                    max_response_bytes=20_000) as c:
        ok = c.post("/v1/embeddings", json={"model": "colbert", "input": ["a short text"]})
        assert ok.status_code == 200, ok.text
        refused = c.post("/v1/embeddings", json={"model": "colbert", "input": ["word " * 200] * 8})
        assert refused.status_code == 413, refused.text[:300]  # 8 texts × 64 tokens × 16 values: 65 KB at least
        assert_error(refused, 413, "response_too_large")
        assert "max_response_bytes" in refused.json()["error"]["message"]
        scored = c.post("/v1/score", json={"model": "colbert", "query": "q", "documents": ["word " * 200] * 4})
        assert scored.status_code == 200, scored.text
