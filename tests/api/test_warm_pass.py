"""The app's warm pass (core/api/warm_pass.py): one request per route family through the app before it
serves, past the API-key gate without a key, counted nowhere, and a failed one logged, not fatal."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from core.api.app import create_app
from core.api.warm_pass import WarmRequest, registry_requests, requests_for
from core.config import Settings

KEY = "warm-pass-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _samples(client, headers=None) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", headers=headers or {})
    assert response.status_code == 200, response.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def _total(samples, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


@pytest.fixture
def settings(minilm_onnx_dir):
    return Settings(models=[{"path": str(minilm_onnx_dir), "name": "minilm"}], threads=2, api_keys=[KEY])


def test_runs_before_start_up_ends_and_passes_the_key_gate_without_a_key(settings, caplog):
    seen = []

    def recording(registry):
        requests = registry_requests(registry)
        seen.extend(requests)
        return requests

    caplog.set_level(logging.INFO, logger="tessera.warm_pass")
    app = create_app(settings, warm_requests=recording)
    with TestClient(app) as client:
        # the lifespan's start-up is over (uvicorn listens only now): the pass has run, every request answered
        assert [r.path for r in seen] == ["/v1/embeddings", "/v1/embeddings"]
        assert [r.body["encoding_format"] for r in seen] == ["float", "base64"]
        assert "warm pass: 2 of 2 requests answered 2xx" in caplog.text
        assert "answered 401" not in caplog.text
        # the key gate still holds for everyone else
        refused = client.post("/v1/embeddings", json={"input": "x"})
        assert refused.status_code == 401
        assert client.get("/ready", headers=AUTH).status_code == 200


def test_counts_no_request_no_batch_and_logs_no_access_line(settings, caplog):
    caplog.set_level(logging.INFO, logger="tessera.access")
    with TestClient(create_app(settings)) as client:
        assert not [r for r in caplog.records if r.name == "tessera.access"]
        before = _samples(client, AUTH)
        assert _total(before, "tessera_requests_total", route="/v1/embeddings") == 0
        assert _total(before, "tessera_request_seconds_count", route="/v1/embeddings") == 0
        assert _total(before, "tessera_batch_size_count") == 0
        assert _total(before, "tessera_rejected_requests_total") == 0
        # the series it touched exist, at 0 (a counter that first appears at 1 loses that 1 in rate())
        assert (("tessera_requests_total", (("route", "/v1/embeddings"), ("status", "200")))) in before
        assert client.post("/v1/embeddings", json={"input": "a user's text"}, headers=AUTH).status_code == 200
        after = _samples(client, AUTH)
        assert _total(after, "tessera_requests_total", route="/v1/embeddings", status="200") == 1
        assert _total(after, "tessera_batch_size_count") == 1
        assert len([r for r in caplog.records if r.name == "tessera.access"]) >= 1


def test_only_the_process_own_marker_passes_the_gate(settings):
    """A scope whose marker is merely equal-looking (not the object) is an ordinary request: 401 without a key."""
    import asyncio

    from core.api import warm_pass

    app = create_app(settings)
    request = WarmRequest("POST", "/v1/embeddings", {"input": "x"})

    async def status_with(marker) -> int:
        scope = warm_pass.scope_of(request)
        scope["extensions"] = {"tessera.warm_pass": marker}
        sent, bodies = [], [{"type": "http.request", "body": b'{"input": "x"}', "more_body": False}]

        async def receive():
            if bodies:
                return bodies.pop()
            await asyncio.sleep(60)  # the client stays; the gate answers before reading the body anyway
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return sent[0]["status"]

    with TestClient(app) as client:
        assert client.portal.call(status_with, True) == 401
        assert client.portal.call(status_with, "tessera.warm_pass") == 401
        assert client.portal.call(warm_pass.call, app, request).status == 200  # the real marker


def test_a_failed_warm_request_is_logged_and_the_server_serves(settings, caplog):
    caplog.set_level(logging.WARNING, logger="tessera.warm_pass")

    def with_a_bad_one(registry):
        return [WarmRequest("POST", "/v1/embeddings", {"input": 42}, label="bad"), *registry_requests(registry)]

    with TestClient(create_app(settings, warm_requests=with_a_bad_one)) as client:
        assert "answered 422" in caplog.text and "(bad)" in caplog.text
        assert client.get("/ready", headers=AUTH).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "x"}, headers=AUTH).status_code == 200
        assert _total(_samples(client, AUTH), "tessera_requests_total", status="422") == 0


def test_every_route_family_of_the_text_tasks(minilm_onnx_dir, reranker_dir, classifier_dir, splade_dir, caplog):
    caplog.set_level(logging.INFO, logger="tessera.warm_pass")
    models = [{"path": str(minilm_onnx_dir), "name": "embed"}, {"path": str(reranker_dir), "name": "rerank"},
              {"path": str(classifier_dir), "name": "classify"}, {"path": str(splade_dir), "name": "sparse"}]
    seen = []

    def recording(registry):
        seen.extend(registry_requests(registry))
        return seen

    with TestClient(create_app(Settings(models=models, threads=2), warm_requests=recording)) as client:
        assert {r.path for r in seen} == {"/v1/embeddings", "/v1/rerank", "/v1/classify", "/v1/embeddings/sparse"}
        assert f"warm pass: {len(seen)} of {len(seen)} requests answered 2xx" in caplog.text
        assert _total(_samples(client), "tessera_requests_total") == 0


@pytest.mark.parametrize("fixture, modality", [("clip_dir", "image"), ("clap_dir", "audio")])
def test_multimodal_models_get_one_request_per_modality(fixture, modality, request, caplog):
    folder = request.getfixturevalue(fixture)
    caplog.set_level(logging.INFO, logger="tessera.warm_pass")
    with TestClient(create_app(Settings(models=[{"path": str(folder), "name": "mm"}], threads=2))) as client:
        engine = client.app.state.registry.engines["mm"]
        sent = requests_for("mm", engine.task.capabilities, engine.task.modalities)
        assert [r.body.get("modality", "text") for r in sent] == ["text", "text", modality]
        assert f"warm pass: {len(sent)} of {len(sent)} requests answered 2xx" in caplog.text


def test_url_prefix(minilm_onnx_dir, caplog):
    caplog.set_level(logging.INFO, logger="tessera.warm_pass")
    settings = Settings(models=[{"path": str(minilm_onnx_dir), "name": "minilm"}], threads=2, url_prefix="/api")
    with TestClient(create_app(settings)):
        assert "warm pass: 2 of 2 requests answered 2xx" in caplog.text
