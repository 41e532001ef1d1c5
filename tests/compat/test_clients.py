"""The peers' real client libraries against a real server on loopback: cohere (rerank) and the OpenAI SDK
(embeddings with prompts)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.compat.conftest import SPEC_PROMPTS

QUERY = "How many people live in Berlin?"
DOCS = [
    "Berlin has a population of 3.5 million registered inhabitants.",
    "The capital of France is Paris.",
    "Cats sleep most of the day.",
    "About 3.7 million people lived in Berlin in 2023.",
]


def test_cohere_v2_rerank(server, reranker_dir):
    import cohere
    from sentence_transformers import CrossEncoder

    client = cohere.ClientV2(api_key="unused", base_url=server)
    response = client.rerank(model="reranker", query=QUERY, documents=DOCS, top_n=3)
    ref = CrossEncoder(str(reranker_dir), device="cpu").predict([(QUERY, d) for d in DOCS])
    assert [r.index for r in response.results] == np.argsort(-ref, kind="stable")[:3].tolist()
    for r in response.results:
        assert r.relevance_score == pytest.approx(float(ref[r.index]), abs=1e-5)


def test_cohere_rejects_bad_top_n(server):
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=server)
    with pytest.raises(cohere.core.api_error.ApiError) as err:
        client.rerank(model="reranker", query=QUERY, documents=DOCS, top_n=0)
    assert err.value.status_code == 400
    assert "top_n" in str(err.value.body)


def test_openai_embeddings_with_prompt_name(server, st_minilm):
    from openai import OpenAI

    client = OpenAI(api_key="unused", base_url=server + "/v1")
    texts = ["how big is Berlin?", "a sunny day"]
    response = client.embeddings.create(model="minilm", input=texts, extra_body={"prompt_name": "query"})
    ours = np.array([d.embedding for d in response.data], dtype=np.float32)
    ref = st_minilm.encode(texts, prompt=SPEC_PROMPTS["query"])
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    plain = client.embeddings.create(model="minilm", input=texts)
    prompt_tokens = len(st_minilm.tokenizer(SPEC_PROMPTS["query"], add_special_tokens=False)["input_ids"])
    assert response.usage.prompt_tokens == plain.usage.prompt_tokens + 2 * prompt_tokens


def test_openai_unknown_prompt_is_400(server):
    import openai
    from openai import OpenAI

    client = OpenAI(api_key="unused", base_url=server + "/v1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="minilm", input="x", extra_body={"prompt_name": "nope"})
    assert "query" in str(err.value)  # names the model's prompts


def test_openai_embeddings_on_a_reranker_names_its_tasks(server):
    import openai
    from openai import OpenAI

    client = OpenAI(api_key="unused", base_url=server + "/v1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="reranker", input="x")
    assert "rerank" in str(err.value) and "tokenize" in str(err.value)
