"""The embedding cache (setting ``embedding_cache``): in memory and on a real Redis server."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.cache import EmbeddingCache, decode_value, encode_value
from core.cache.stores import ENTRY_OVERHEAD, MemoryStore
from core.config import Settings
from core.errors import ConfigError
from core.config import settings_from_env
from tests.support.redis_server import RedisServer, redis_server
from tests.support.server import environ_without_settings, running_server

TEXTS = [f"sentence number {i} about {topic}" for i, topic in
         enumerate(["cats", "the sea", "a train", "old books", "rain", "bread", "music", "snow"])]


def vectors_of(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in response.json()["data"]])


def post(client, texts, **options):
    return client.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64", **options})


def metric(text: str, name: str, **labels) -> float:
    """The sum of ``name``'s samples (with these labels) in a Prometheus exposition."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def app_client(models, **settings):
    return TestClient(create_app(Settings(models=models, threads=2, **settings)))


@pytest.fixture(scope="module")
def onnx_model(minilm_onnx_dir):
    return [{"path": str(minilm_onnx_dir), "name": "minilm", "backend": "onnx"}]


@pytest.fixture(scope="module")
def uncached(onnx_model):
    with app_client(onnx_model, embedding_cache="off") as client:
        yield client


@pytest.fixture(scope="module")
def cached(onnx_model):
    with app_client(onnx_model, embedding_cache="memory") as client:
        yield client


def test_settings_accept_off_memory_and_redis_urls_only():
    assert Settings().embedding_cache == "off"
    assert Settings(embedding_cache="MEMORY").embedding_cache == "memory"
    assert Settings(embedding_cache="redis://cache:6379/2").embedding_cache == "redis://cache:6379/2"
    with pytest.raises(ConfigError, match="embedding_cache"):
        settings_from_env({"TESSERA_EMBEDDING_CACHE": "disk"})


def test_a_hit_answers_the_bytes_the_miss_gave_and_an_uncached_server_gives(cached, uncached):
    texts = [t + " (hit test)" for t in TEXTS]
    before = cached.get("/metrics").text
    first = post(cached, texts)
    second = post(cached, texts)
    after = cached.get("/metrics").text
    assert metric(after, "tessera_embedding_cache_misses_total", model="minilm") - \
        metric(before, "tessera_embedding_cache_misses_total", model="minilm") == len(texts)
    assert metric(after, "tessera_embedding_cache_hits_total", model="minilm") - \
        metric(before, "tessera_embedding_cache_hits_total", model="minilm") == len(texts)
    assert vectors_of(first).tobytes() == vectors_of(second).tobytes()
    assert vectors_of(second).tobytes() == vectors_of(post(uncached, texts)).tobytes()
    assert first.json()["usage"] == second.json()["usage"] == post(uncached, texts).json()["usage"]


def test_part_hits_keep_the_order_and_repeats_inside_a_request_are_computed_once(cached, uncached):
    known = [t + " (order)" for t in TEXTS[:3]]
    post(cached, known)
    before = cached.get("/metrics").text
    texts = [known[2], "a new text (order)", known[0], "a new text (order)", known[1]]
    answer = post(cached, texts)
    after = cached.get("/metrics").text
    assert metric(after, "tessera_embedding_cache_misses_total") - metric(before, "tessera_embedding_cache_misses_total") == 1
    assert metric(after, "tessera_embedding_cache_hits_total") - metric(before, "tessera_embedding_cache_hits_total") == 4
    np.testing.assert_allclose(vectors_of(answer), vectors_of(post(uncached, texts)), atol=1e-6)
    assert answer.json()["usage"] == post(uncached, texts).json()["usage"]


@pytest.mark.parametrize("options", [
    {"dimensions": 64}, {"normalize": False}, {"prompt": "query: "}, {"truncate": True, "dimensions": 32},
    {"chunking": {"size": 8, "overlap": 2}},
])
def test_options_that_change_a_vector_never_share_an_entry(cached, uncached, options):
    text = ["the options test sentence, long enough to need a few windows of eight tokens each"]
    post(cached, text)  # the plain vector is cached
    varied = post(cached, text, **options)
    assert vectors_of(varied).tobytes() == vectors_of(post(uncached, text, **options)).tobytes()
    again = post(cached, text, **options)
    assert vectors_of(again).tobytes() == vectors_of(varied).tobytes()
    assert again.json()["usage"] == varied.json()["usage"]


def test_quantized_answers_come_from_the_cached_floats(cached, uncached):
    texts = [t + " (quantized)" for t in TEXTS[:4]]
    post(cached, texts)
    for kind in ("int8", "ubinary"):
        body = {"input": texts, "embedding_type": kind}
        assert cached.post("/v1/embeddings", json=body).json()["data"] == \
            uncached.post("/v1/embeddings", json=body).json()["data"]


def test_a_refused_input_gets_the_uncached_error(cached, uncached):
    texts = ["fine", "word " * 2000]
    a = cached.post("/v1/embeddings", json={"input": texts, "truncate": False})
    b = uncached.post("/v1/embeddings", json={"input": texts, "truncate": False})
    assert a.status_code == b.status_code == 413
    assert a.json() == b.json()


def test_two_models_never_share_entries(minilm_dir, minilm_onnx_dir):
    models = [{"path": str(minilm_onnx_dir), "name": "fp32", "backend": "onnx"},
              {"path": str(minilm_onnx_dir), "name": "int8", "backend": "onnx", "dtype": "int8"},
              {"path": str(minilm_onnx_dir), "name": "fp32-again", "backend": "onnx"}]
    with app_client(models, embedding_cache="memory") as client:
        texts = ["one text for two models"]
        fp32 = vectors_of(post(client, texts, model="fp32"))
        int8 = vectors_of(post(client, texts, model="int8"))
        assert not np.array_equal(fp32, int8)
        metrics = client.get("/metrics").text
        assert metric(metrics, "tessera_embedding_cache_misses_total", model="int8") == 1
        # the same folder, backend and dtype under another name: the same model, its entries shared
        again = vectors_of(post(client, texts, model="fp32-again"))
        assert again.tobytes() == fp32.tobytes()
        assert metric(client.get("/metrics").text, "tessera_embedding_cache_hits_total", model="fp32-again") == 1


def test_access_log_counts_hits_and_misses(cached, caplog):
    texts = ["access log text one", "access log text two"]
    post(cached, texts[:1])
    with caplog.at_level(logging.INFO, logger="tessera.access"):
        cached.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"},
                    headers={"X-Request-Id": "cache-counts"})
    # by its id: the first request's line is written once its answer has gone, and may come in this window
    (record,) = [r for r in caplog.records if r.name == "tessera.access" and
                 getattr(r, "fields", {}).get("request_id") == "cache-counts"]
    assert record.fields["cache_hits"] == 1 and record.fields["cache_misses"] == 1


def test_memory_store_keeps_its_byte_bound_least_recently_used_first():
    value = encode_value(np.arange(8, dtype=np.float32), 5)
    entry = 20 + len(value) + ENTRY_OVERHEAD
    store = MemoryStore(max_bytes=3 * entry)

    async def run():
        await store.set_many({bytes([i]) * 20: value for i in range(3)})
        await store.get_many([bytes([0]) * 20])  # 0 is now the most recent
        await store.set_many({bytes([9]) * 20: value})
        return await store.get_many([bytes([i]) * 20 for i in (0, 1, 2, 9)])

    got = asyncio.run(run())
    assert [g is not None for g in got] == [True, False, True, True]
    assert store.bytes <= store.max_bytes and len(store) == 3
    vector, tokens = decode_value(got[0])
    assert tokens == 5 and vector.tobytes() == np.arange(8, dtype=np.float32).tobytes()


# --- Redis ------------------------------------------------------------------------------------------


def server_env(model_dir, url: str) -> dict[str, str]:
    import json

    return {**environ_without_settings(), "TESSERA_MODELS": json.dumps(
        [{"path": str(model_dir), "name": "minilm", "backend": "onnx"}]), "TESSERA_EMBEDDING_CACHE": url,
        "TESSERA_THREADS": "1", "TESSERA_CACHE_DIR": os.environ["TESSERA_CACHE_DIR"], "TESSERA_AUTO_EXPORT": "false"}


def test_two_servers_sharing_one_redis_the_second_answers_from_the_firsts_work(minilm_onnx_dir):
    import httpx

    texts = [t + " (shared)" for t in TEXTS]
    with redis_server() as redis, running_server(server_env(minilm_onnx_dir, redis.url)) as first, \
            running_server(server_env(minilm_onnx_dir, redis.url)) as second:
        body = {"input": texts, "encoding_format": "base64"}
        a = httpx.post(first + "/v1/embeddings", json=body, timeout=60)
        assert redis.keys() >= len(texts)
        b = httpx.post(second + "/v1/embeddings", json=body, timeout=60)
        assert vectors_of(a).tobytes() == vectors_of(b).tobytes()
        assert a.json()["usage"] == b.json()["usage"]
        seen = httpx.get(second + "/metrics", timeout=30).text
        assert metric(seen, "tessera_embedding_cache_hits_total", model="minilm") == len(texts)
        assert metric(seen, "tessera_embedding_cache_misses_total", model="minilm") == 0
        assert metric(seen, "tessera_batch_size_count", model="minilm") == 0  # no model work on the second


def test_redis_killed_mid_run_degrades_to_no_cache_without_errors(minilm_onnx_dir):
    import httpx

    redis = RedisServer().start()
    try:
        with running_server(server_env(minilm_onnx_dir, redis.url)) as base:
            def ask(i):
                return httpx.post(base + "/v1/embeddings", json={"input": [f"killed redis {i}", TEXTS[i % 8]]},
                                  timeout=60)

            statuses = [ask(i).status_code for i in range(4)]
            redis.kill()
            statuses += [ask(i).status_code for i in range(4, 16)]
            assert statuses == [200] * 16
            seen = httpx.get(base + "/metrics", timeout=30).text
            assert metric(seen, "tessera_embedding_cache_errors_total") >= 1
            # the same port again: the cache comes back once its retry time has passed
            redis = RedisServer(redis.port).start()
            deadline = __import__("time").monotonic() + 60
            while redis.keys() == 0:
                assert ask(100).status_code == 200
                assert __import__("time").monotonic() < deadline, "the cache was not used again"
                __import__("time").sleep(0.5)
    finally:
        redis.stop()


def test_redis_url_without_the_client_package_names_the_extra(monkeypatch):
    import sys

    from core.cache.stores import RedisStore
    from core.errors import MissingDependency

    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(MissingDependency, match=r"\[redis\]"):
        asyncio.run(RedisStore("redis://127.0.0.1:1/0").get_many([b"k"]))


def test_an_unreachable_redis_serves_from_the_model_with_one_warning(onnx_model, uncached, caplog):
    """Nothing listens at the URL: every request is answered by the model, as without a cache, the failure
    is logged once (not per request) and counted."""
    from benchmarks.loopback import free_port

    import time

    from core.cache import RETRY_S

    texts = [t + " (no redis)" for t in TEXTS[:4]]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tessera.cache"), \
            app_client(onnx_model, embedding_cache=f"redis://127.0.0.1:{free_port()}/0") as client:
        answers = [post(client, texts) for _ in range(3)]
        metrics = client.get("/metrics").text
    windows = 1 + int((time.monotonic() - started) / RETRY_S)  # one warning per retry window at most
    for answer in answers:
        assert vectors_of(answer).tobytes() == vectors_of(post(uncached, texts)).tobytes()
    warnings = [r for r in caplog.records if r.name == "tessera.cache"]
    assert 1 <= len(warnings) <= windows and "unavailable" in warnings[0].getMessage()
    assert metric(metrics, "tessera_embedding_cache_errors_total", op="get") >= 1
