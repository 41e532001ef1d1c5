"""Values planted in a real Redis under the very key the server computed: every one that is not a value this
version wrote for the request (another length, dimension, layout or element type, non-finite floats, an
impossible token count) is a miss, counted in ``tessera_embedding_cache_bad_values``, answered by the model
and replaced in the store, never a wrong vector, a wrong ``usage`` or a 500."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import Settings
from tests.cache.test_embedding_cache import metric, vectors_of
from tests.support.redis_server import redis_server

#: the value layout this test plants (core/cache ``HEADER``): magic, version, element type, tokens, dimension
LAYOUT = "<2sBBII"
DIM = 384


def header(tokens: int, dimension: int, *, magic: bytes = b"TE", version: int = 2, kind: int = 1) -> bytes:
    return struct.pack(LAYOUT, magic, version, kind, tokens, dimension)


def floats(n: int, value: float = 0.5) -> bytes:
    return np.full(n, value, dtype="<f4").tobytes()


#: name → the bytes planted over a good entry
PLANTED = {
    "empty": b"",
    "3 bytes": b"abc",
    "5 bytes": b"\x05\x00\x00\x00\x01",
    "10 floats": header(5, 10) + floats(10),
    "1,000,000 floats": header(5, 1_000_000) + floats(1_000_000),
    "384 NaN": header(5, DIM) + floats(DIM, float("nan")),
    "an infinity": header(5, DIM) + floats(DIM - 1) + floats(1, float("inf")),
    "token count 2^32-1": header(2**32 - 1, DIM) + floats(DIM),
    "token count over the max length": header(100_000, DIM) + floats(DIM),
    "the unversioned layout (tokens, floats)": (5).to_bytes(4, "little") + floats(DIM),
    "another version": header(5, DIM, version=1) + floats(DIM),
    "another magic": header(5, DIM, magic=b"XX") + floats(DIM),
    "float16 elements": header(5, DIM, kind=2) + np.full(DIM, 0.5, dtype="<f2").tobytes(),
    "header longer than the floats": header(5, DIM) + floats(DIM - 1),
    "floats after the dimension": header(5, DIM) + floats(DIM + 1),
}


def test_the_planted_layout_is_the_caches():
    from core.cache import FLOAT32, HEADER, KEY_VERSION, MAGIC

    assert (HEADER.format, MAGIC, KEY_VERSION, FLOAT32) == (LAYOUT, b"TE", 2, 1)


@pytest.fixture(scope="module")
def redis():
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def client(redis):
    import redis as redis_client

    with redis_client.Redis(host="127.0.0.1", port=redis.port) as conn:
        yield conn


@pytest.fixture(scope="module")
def apps(minilm_onnx_dir, redis):
    models = [{"path": str(minilm_onnx_dir), "name": "minilm", "backend": "onnx"}]
    with TestClient(create_app(Settings(models=models, threads=2, embedding_cache=redis.url))) as cached, \
            TestClient(create_app(Settings(models=models, threads=2, embedding_cache="off"))) as uncached:
        yield cached, uncached


def post(app, text: str):
    return app.post("/v1/embeddings", json={"input": [text], "encoding_format": "base64"})


def stored_key(client, text_request) -> bytes:
    """The one key the server writes for one new text."""
    before = set(client.keys(b"tessera:emb:*"))
    response = text_request()
    assert response.status_code == 200, response.text
    (key,) = set(client.keys(b"tessera:emb:*")) - before
    return key


@pytest.mark.parametrize("name", list(PLANTED))
def test_a_planted_value_is_a_counted_miss_and_is_replaced(apps, client, name):
    cached, uncached = apps
    text = f"a text whose entry is replaced by {name}"
    key = stored_key(client, lambda: post(cached, text))
    good = client.get(key)
    client.set(key, PLANTED[name])
    before = cached.get("/metrics").text
    answer = post(cached, text)
    after = cached.get("/metrics").text
    reference = post(uncached, text)
    assert answer.status_code == 200, answer.text
    assert vectors_of(answer).tobytes() == vectors_of(reference).tobytes()
    assert answer.json()["usage"] == reference.json()["usage"]
    name_ = "tessera_embedding_cache_bad_values_total"
    assert metric(after, name_, model="minilm") - metric(before, name_, model="minilm") == 1
    assert metric(after, "tessera_embedding_cache_misses_total") - \
        metric(before, "tessera_embedding_cache_misses_total") == 1
    assert client.get(key) == good  # the model's answer replaced the planted value


def test_a_good_value_is_still_a_hit(apps, client):
    cached, uncached = apps
    text = "a text read back as it was written"
    stored_key(client, lambda: post(cached, text))
    before = cached.get("/metrics").text
    answer = post(cached, text)
    after = cached.get("/metrics").text
    assert metric(after, "tessera_embedding_cache_hits_total") - metric(before, "tessera_embedding_cache_hits_total") == 1
    assert metric(after, "tessera_embedding_cache_bad_values_total") == metric(before,
                                                                             "tessera_embedding_cache_bad_values_total")
    assert vectors_of(answer).tobytes() == vectors_of(post(uncached, text)).tobytes()


def test_the_key_space_and_values_carry_the_version(apps, client):
    """Keys are ``tessera:emb:v2:`` + 20 bytes and values start with the versioned header: an entry written
    by another layout is never read (its key differs), nor one whose value says another version."""
    cached, _ = apps
    key = stored_key(client, lambda: post(cached, "a text whose key is versioned"))
    assert key.startswith(b"tessera:emb:v2:") and len(key) == len(b"tessera:emb:v2:") + 20
    magic, version, kind, tokens, dimension = struct.unpack_from(LAYOUT, client.get(key))
    assert (magic, version, kind, dimension) == (b"TE", 2, 1, DIM) and 0 < tokens <= 256


def test_a_value_of_another_dimension_is_a_miss_for_a_request_with_dimensions(apps, client):
    """With ``dimensions`` the values hold that many floats: a full-size vector planted there is refused."""
    cached, uncached = apps
    text = "a text asked for in 64 dimensions"
    body = {"input": [text], "encoding_format": "base64", "dimensions": 64}
    key = stored_key(client, lambda: cached.post("/v1/embeddings", json=body))
    client.set(key, header(5, DIM) + floats(DIM))
    answer = cached.post("/v1/embeddings", json=body)
    assert vectors_of(answer).shape == (1, 64)
    assert vectors_of(answer).tobytes() == vectors_of(uncached.post("/v1/embeddings", json=body)).tobytes()


@pytest.mark.parametrize("name", ["10 floats", "384 NaN", "token count 2^32-1", "5 bytes"])
def test_a_bulk_job_on_a_shared_redis_recomputes_planted_values(tmp_path, minilm_onnx_dir, redis, client, name):
    """``python -m core embed`` with ``embedding_cache`` a Redis URL reads the shared entries through the same
    checks: a planted value is computed again, and the job writes the vectors a clean run writes."""
    import asyncio

    import pyarrow.parquet as pq

    from core.bulk.job import JobOptions, run_local
    from tests.bulk.conftest import corpus, write_jsonl

    distinct = [f"{t} ({name})" for t in corpus(40, seed=7)]
    texts = distinct + distinct  # the repeats in later parts: read from the job's own store
    source = write_jsonl(tmp_path / "c.jsonl", texts)
    settings = Settings(models=[{"path": str(minilm_onnx_dir), "name": "minilm", "backend": "onnx"}], threads=1,
                        embedding_cache=redis.url)
    before = set(client.keys(b"tessera:emb:*"))
    parts = {"rows_per_part": 20}
    clean = asyncio.run(run_local(settings, JobOptions(input=str(source), output=str(tmp_path / "a.parquet"), **parts)))
    planted = set(client.keys(b"tessera:emb:*")) - before
    assert clean.computed == len(distinct) == len(planted)
    for key in planted:
        client.set(key, PLANTED[name])
    again = asyncio.run(run_local(settings, JobOptions(input=str(source), output=str(tmp_path / "b.parquet"), **parts)))
    # each planted value computed again once: the bad copy the job's store took in is replaced, not read again
    assert again.computed == len(distinct)

    def vectors(path):
        return pq.read_table(path).column("embedding").combine_chunks().flatten().to_numpy()

    assert vectors(tmp_path / "b.parquet").tobytes() == vectors(tmp_path / "a.parquet").tobytes()
