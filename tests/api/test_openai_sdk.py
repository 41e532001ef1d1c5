"""The real ``openai`` SDK against a real server process (``uvicorn core.dev:app``) on loopback,
with the default configuration: the embedded all-MiniLM-L6-v2."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.support.server import environ_without_settings, running_server


@pytest.fixture(scope="module")
def server():
    env = environ_without_settings()
    env["TESSERA_API_KEYS"] = '["sdk-key"]'
    with running_server(env, headers={"Authorization": "Bearer sdk-key"}) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server + "/v1", api_key="sdk-key", max_retries=0)


def test_float_and_base64_decode_to_the_same_vectors(client, st_minilm):
    texts = ["The SDK decodes base64 by default.", "Zweiter Satz auf Deutsch."]
    as_float = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    as_b64 = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="base64")
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)  # the SDK asks for base64
    a = np.array([d.embedding for d in as_float.data])
    # asked explicitly, the SDK hands the base64 string through; decoded as OpenAI documents it
    b = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in as_b64.data])
    c = np.array([d.embedding for d in default.data])
    assert a.shape == (2, 384)
    np.testing.assert_allclose(a, b, atol=1e-7)
    np.testing.assert_allclose(a, c, atol=1e-7)
    ref = st_minilm.encode(texts)
    np.testing.assert_allclose(a, ref, atol=1e-5)
    assert as_float.usage.prompt_tokens > 0 and as_float.model == "all-MiniLM-L6-v2"


def test_dimensions(client):
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input="matryoshka via the SDK", dimensions=128)
    v = np.array(r.data[0].embedding)
    assert v.shape == (128,)
    assert abs(np.linalg.norm(v) - 1.0) < 1e-5


def test_sdk_sees_errors_as_exceptions(client, server):
    import openai

    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(model="no-such-model", input="x")
    assert info.value.body["code"] == "model_not_found"
    bad = openai.OpenAI(base_url=server + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model="all-MiniLM-L6-v2", input="x")


def test_models_list(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["all-MiniLM-L6-v2"]


def test_client_disconnect_drops_queued_work(server):
    """A client that gives up has its queued items dropped (the metric shows it); the server keeps serving."""
    import httpx

    headers = {"Authorization": "Bearer sdk-key"}
    big = {"input": ["a long text to keep the model busy " * 20] * 256}

    def dropped() -> float:
        text = httpx.get(server + "/metrics", headers=headers).text
        lines = [l for l in text.splitlines() if l.startswith("tessera_dropped_items_total") and "cancelled" in l]
        return sum(float(l.rsplit(" ", 1)[1]) for l in lines)

    before = dropped()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/embeddings", json=big, headers=headers, timeout=0.3)
    # the server notices the disconnect and drops what it had not yet run
    import time

    deadline = time.monotonic() + 30
    while dropped() <= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert dropped() > before
    ok = httpx.post(server + "/v1/embeddings", json={"input": "still serving"}, headers=headers, timeout=30)
    assert ok.status_code == 200



def test_quantized_embedding_types_decode_right_through_the_sdk(client, server):
    """The SDK asks for base64 and decodes float32: int8 codes used to come out as garbage (1.5e+25)."""
    import httpx

    texts = ["int8 through the SDK", "second text"]
    for embedding_type, dtype, width in (("int8", np.int8, 384), ("ubinary", np.uint8, 48)):
        got = client.embeddings.create(input=texts, model="all-MiniLM-L6-v2",
                                       extra_body={"embedding_type": embedding_type})
        raw = httpx.post(server + "/v1/embeddings", json={"input": texts, "embedding_type": embedding_type},
                         headers={"Authorization": "Bearer sdk-key"}, timeout=60).json()
        expected = np.array([d["embedding"] for d in raw["data"]], dtype=dtype)
        vectors = np.array([d.embedding for d in got.data])
        assert vectors.shape == (2, width)
        np.testing.assert_array_equal(vectors, expected.astype(np.float64))
