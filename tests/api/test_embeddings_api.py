"""/v1/embeddings through the real app: semantics, routing, concurrency, every error path."""

from __future__ import annotations

import base64
import concurrent.futures
import json

import numpy as np
import pytest

from core.tokenization import TextTokenizer
from tests.api.conftest import SlowBackend, assert_error, client_for


def vectors(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


def test_openai_response_shape_and_real_token_usage(two_models, minilm_dir):
    texts = ["hello world", "The cat sits on the mat."]
    r = two_models.post("/v1/embeddings", json={"input": texts, "model": "minilm"})
    body = r.json()
    assert body["object"] == "list" and body["model"] == "minilm"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 384 for d in body["data"])
    expected_tokens = sum(e.cost for e in TextTokenizer(minilm_dir, 256).encode(texts))
    assert body["usage"] == {"prompt_tokens": expected_tokens, "total_tokens": expected_tokens}


def test_alias_route_and_string_input(two_models):
    a = vectors(two_models.post("/embeddings", json={"input": "hello", "model": "minilm"}))
    b = vectors(two_models.post("/v1/embeddings", json={"input": ["hello"], "model": "minilm"}))
    assert a.shape == (1, 384)
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_routes_by_model_and_both_backends_agree(two_models):
    texts = ["routing test", "another sentence"]
    t = vectors(two_models.post("/v1/embeddings", json={"input": texts, "model": "minilm"}))
    o = vectors(two_models.post("/v1/embeddings", json={"input": texts, "model": "minilm-onnx"}))
    assert two_models.post("/v1/embeddings", json={"input": texts, "model": "minilm-onnx"}).json()["model"] == "minilm-onnx"
    np.testing.assert_allclose(t, o, atol=1e-4)
    cards = {m["id"]: m for m in two_models.get("/v1/models").json()["data"]}
    assert cards["minilm"]["backend"] == "torch" and cards["minilm-onnx"]["backend"] == "onnx"


def test_model_may_be_omitted_with_one_model_only(two_models, one_model):
    assert one_model.post("/v1/embeddings", json={"input": "x"}).status_code == 200
    assert_error(two_models.post("/v1/embeddings", json={"input": "x"}), 404, "model_not_found")


def test_base64_decodes_to_the_float_vectors(one_model):
    texts = ["base64 round trip", "ünïcödé"]
    floats = vectors(one_model.post("/v1/embeddings", json={"input": texts}))
    r = one_model.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"})
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in r.json()["data"]])
    np.testing.assert_allclose(decoded, floats, rtol=1e-6, atol=1e-7)


def test_dimensions_truncates_then_renormalizes(one_model):
    full = vectors(one_model.post("/v1/embeddings", json={"input": ["matryoshka"]}))
    short = vectors(one_model.post("/v1/embeddings", json={"input": ["matryoshka"], "dimensions": 64}))
    assert short.shape == (1, 64)
    np.testing.assert_allclose(np.linalg.norm(short), 1.0, atol=1e-5)
    expected = full[:, :64] / np.linalg.norm(full[:, :64])
    np.testing.assert_allclose(short, expected, atol=1e-6)


def test_normalize_false_returns_raw_pooled_vectors(one_model):
    raw = vectors(one_model.post("/v1/embeddings", json={"input": ["norms"], "normalize": False}))
    unit = vectors(one_model.post("/v1/embeddings", json={"input": ["norms"]}))
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw), unit, atol=1e-6)


def test_token_id_input_equals_text_input(one_model, minilm_dir):
    tok = TextTokenizer(minilm_dir, 256)
    ids = [int(i) for i in tok.encode(["token ids work"])[0].ids]
    from_text = vectors(one_model.post("/v1/embeddings", json={"input": "token ids work"}))
    from_ids = vectors(one_model.post("/v1/embeddings", json={"input": ids}))
    from_ids_list = vectors(one_model.post("/v1/embeddings", json={"input": [ids, ids]}))
    np.testing.assert_allclose(from_ids, from_text, atol=1e-6)
    assert from_ids_list.shape == (2, 384)


def test_truncate_default_and_refusal(one_model):
    long = "word " * 400
    assert one_model.post("/v1/embeddings", json={"input": long}).json()["usage"]["prompt_tokens"] == 256
    err = assert_error(one_model.post("/v1/embeddings", json={"input": ["ok", long], "truncate": False}),
                       413, "input_too_long")
    assert "input[1]" in err["message"] and "256" in err["message"]


def test_batched_request_equals_single_requests(one_model, sentences):
    batched = vectors(one_model.post("/v1/embeddings", json={"input": sentences}))
    singles = np.concatenate([vectors(one_model.post("/v1/embeddings", json={"input": s})) for s in sentences])
    np.testing.assert_allclose(batched, singles, atol=2e-5)


def test_many_concurrent_requests_each_get_their_own_vectors(one_model, sentences):
    expected = {s: vectors(one_model.post("/v1/embeddings", json={"input": s}))[0] for s in sentences[:20]}

    def call(i):
        texts = [sentences[(i + k) % 20] for k in range(3)]
        return texts, vectors(one_model.post("/v1/embeddings", json={"input": texts}))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(48)))
    for texts, got in results:
        for text, vec in zip(texts, got):
            np.testing.assert_allclose(vec, expected[text], atol=2e-5)


@pytest.mark.parametrize(
    "body,status,code",
    [
        ({}, 400, "invalid_input"),  # neither input nor messages
        ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_input"),
        ({"input": 5}, 422, "validation_error"),
        ({"input": [1.5]}, 422, "validation_error"),
        ({"input": ["a", 1]}, 422, "validation_error"),
        ({"input": "x", "encoding_format": "hex"}, 422, "validation_error"),
        ({"input": "x", "dimensions": -1}, 422, "validation_error"),
        ({"input": []}, 400, "invalid_input"),
        ({"input": [[]]}, 400, "invalid_input"),
        ({"input": [-1, 5]}, 400, "invalid_token_id"),
        ({"input": [10**9]}, 400, "invalid_token_id"),
        ({"input": "x", "dimensions": 4096}, 400, "invalid_input"),
        ({"input": "x", "model": "nope"}, 404, "model_not_found"),
    ],
)
def test_bad_input_gets_the_error_shape(one_model, body, status, code):
    assert_error(one_model.post("/v1/embeddings", json=body), status, code)


def test_invalid_json_and_unknown_routes(one_model):
    assert_error(one_model.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}),
                 400, "invalid_json")
    assert_error(one_model.get("/v1/nothing"), 404, "not_found")
    assert_error(one_model.get("/v1/embeddings"), 405, "method_not_allowed")


def test_limits_from_settings(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir)}], max_items_per_request=3, max_chars_per_item=50,
                    max_request_bytes=2000) as c:
        assert_error(c.post("/v1/embeddings", json={"input": ["a"] * 4}), 413, "too_large")
        assert_error(c.post("/v1/embeddings", json={"input": "x" * 51}), 413, "too_large")
        assert_error(c.post("/v1/embeddings", json={"input": ["y" * 40] * 3 + ["z" * 2000]}), 413, "body_too_large")
        # streamed without Content-Length: the limit still holds
        chunks = iter([json.dumps({"input": "q" * 3000}).encode()])
        assert_error(c.post("/v1/embeddings", content=chunks, headers={"content-type": "application/json"}),
                     413, "body_too_large")
        assert c.post("/v1/embeddings", json={"input": ["fine"] * 3}).status_code == 200


def test_api_keys(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir)}], api_keys=["k1", "k2"]) as c:
        assert c.get("/health").status_code == 200  # the probes stay open
        assert c.get("/ready").status_code == 200
        for path in ("/v1/models", "/metrics"):
            assert_error(c.get(path), 401, "invalid_api_key")
        assert_error(c.post("/v1/embeddings", json={"input": "x"}), 401)
        assert_error(c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer k3"}), 401)
        assert_error(c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Basic k1"}), 401)
        for key in ("k1", "k2"):
            ok = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        assert c.get("/v1/models", headers={"x-api-key": "k2"}).status_code == 200


def test_deadline_passed_is_504_and_server_keeps_serving(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}]) as c:
        engine = c.app.state.registry.engines["m"]
        engine.backend = SlowBackend(engine.backend, 0.5)
        assert_error(c.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": "0.1"}),
                     504, "deadline_exceeded")
        assert_error(c.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Timeout": "soon"}), 400)
        engine.backend = engine.backend.inner
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200


def test_queue_full_is_429_with_retry_after(minilm_onnx_dir):
    models = [{"path": str(minilm_onnx_dir), "name": "m", "max_queue_items": 4, "max_batch_size": 2}]
    with client_for(models=models, retry_after_s=2) as c:
        engine = c.app.state.registry.engines["m"]
        engine.backend = SlowBackend(engine.backend, 0.3)
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(lambda i: c.post("/v1/embeddings", json={"input": [f"t{i}"] * 2}), range(12)))
        statuses = sorted(r.status_code for r in responses)
        assert set(statuses) == {200, 429}, statuses
        limited = [r for r in responses if r.status_code == 429]
        assert all(r.headers["retry-after"] == "2" for r in limited)
        for r in limited:
            assert_error(r, 429, "overloaded")


def test_backend_fault_fails_only_that_batch_and_ready_reflects_repeats(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}]) as c:
        engine = c.app.state.registry.engines["m"]
        real = engine.backend

        class Broken(SlowBackend):
            def run(self, inputs):
                raise RuntimeError("device lost")

        engine.backend = Broken(real, 0)
        err = assert_error(c.post("/v1/embeddings", json={"input": "x"}), 500, "backend_failure")
        assert "device lost" in err["message"]
        assert c.get("/ready").status_code == 200  # one failure is not yet unhealthy
        for _ in range(2):
            c.post("/v1/embeddings", json={"input": "x"})
        assert_error(c.get("/ready"), 503, "not_ready")
        assert c.get("/health").status_code == 200
        engine.backend = real
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200
        assert c.get("/ready").status_code == 200  # a good batch restores health


def test_model_that_fails_to_load_leaves_others_serving(minilm_onnx_dir, tmp_path):
    models = [{"path": str(minilm_onnx_dir), "name": "good"}, {"path": str(tmp_path), "name": "broken"}]
    with client_for(models=models, allow_degraded=True) as c:
        assert c.post("/v1/embeddings", json={"input": "x", "model": "good"}).status_code == 200
        err = assert_error(c.post("/v1/embeddings", json={"input": "x", "model": "broken"}), 503, "not_ready")
        assert "config.json" in err["message"]
        assert "failed to load" in c.get("/ready").json()["models"]["broken"]  # degraded, as allowed
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["good"]


def test_metrics_exposes_requests_queue_and_batches(one_model):
    one_model.post("/v1/embeddings", json={"input": ["metrics"] * 3})
    text = one_model.get("/metrics").text
    for name in ("tessera_requests_total", "tessera_queue_depth", "tessera_batch_size_bucket",
                 "tessera_batch_tokens_bucket", "tessera_queue_seconds_bucket", "tessera_inference_seconds_bucket"):
        assert name in text, name
    assert 'tessera_requests_total{route="/v1/embeddings",status="200"}' in text


def test_health_ready_models(one_model):
    assert one_model.get("/health").json() == {"status": "ok"}
    assert one_model.get("/ready").json()["status"] == "ready"
    card = one_model.get("/v1/models").json()["data"][0]
    assert {"id", "object", "task", "backend", "dtype", "dimension", "max_length"} <= set(card)
    assert card["dimension"] == 384 and card["max_length"] == 256


def test_openapi_schema_is_served(one_model):
    schema = one_model.get("/openapi.json").json()
    assert "/v1/embeddings" in schema["paths"]
