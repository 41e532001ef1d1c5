"""Auth on every route (table-driven from the app's own routes), key sources, constant-time comparison,
no request text in logs, no path traversal through 'model', trust_remote_code refused by default."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from fastapi.routing import APIRoute

import core.api.keys as keys_module
from tests.api.conftest import assert_error, client_for

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def guarded(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}], api_keys=[KEY]) as client:
        yield client


def routes(app):
    """Every (method, path) the app serves, aliases hidden from the schema included."""

    def walk(items):
        for route in items:
            if hasattr(route, "original_router"):  # an included router (FastAPI ≥ 0.16x builds them lazily)
                yield from walk(route.original_router.routes)
            elif isinstance(route, APIRoute) or hasattr(route, "methods"):
                for method in sorted(route.methods or ()):
                    if method != "HEAD":
                        yield method, route.path

    return sorted(set(walk(app.routes)))


def test_every_route_needs_the_key_but_the_probes(guarded):
    table = list(routes(guarded.app))
    assert len(table) >= 15  # a new route lands in this table by itself
    for method, path in table:
        anonymous = guarded.request(method, path, json={})
        if path in ("/health", "/ready"):  # platform probes send no key
            assert anonymous.status_code == 200
            continue
        assert_error(anonymous, 401, "invalid_api_key")
        wrong = guarded.request(method, path, json={}, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401, "invalid_api_key")
        allowed = guarded.request(method, path, json={}, headers={"Authorization": f"Bearer {KEY}"})
        assert allowed.status_code != 401, (method, path)


def test_keys_are_compared_in_constant_time(guarded, monkeypatch):
    calls = []
    real = keys_module.hmac.compare_digest

    def recording(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", recording)
    guarded.get("/v1/models", headers={"Authorization": "Bearer guess"})
    assert calls == [(b"guess", KEY.encode())]


def test_keys_from_a_file_and_public_metrics(minilm_onnx_dir, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("\nfrom-file-1\n  from-file-2  \n")
    with client_for(models=[{"path": str(minilm_onnx_dir)}], api_keys_file=str(keys), metrics_public=True) as c:
        assert c.get("/metrics").status_code == 200
        assert_error(c.get("/v1/models"), 401)
        for key in ("from-file-1", "from-file-2"):
            assert c.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_no_request_text_or_key_in_logs(guarded, caplog):
    secret_text = "patient John Doe has condition XYZ-123"
    caplog.set_level(logging.DEBUG)
    guarded.post("/v1/embeddings", json={"input": secret_text}, headers={"Authorization": f"Bearer {KEY}"})
    guarded.post("/v1/embeddings", json={"input": [secret_text], "dimensions": 10**6},
                 headers={"Authorization": f"Bearer {KEY}"})
    guarded.post("/v1/embeddings", json={"input": secret_text}, headers={"Authorization": "Bearer wrong-key"})
    logged = caplog.text
    assert "John Doe" not in logged and KEY not in logged and "wrong-key" not in logged


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "..", "m/../m", "~root"])
def test_model_field_is_a_name_not_a_path(guarded, name):
    r = guarded.post("/v1/embeddings", json={"input": "x", "model": name}, headers={"Authorization": f"Bearer {KEY}"})
    assert_error(r, 404, "model_not_found")
    assert "passwd" not in json.dumps(guarded.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json())


def test_remote_code_is_refused_unless_trusted(minilm_dir, minilm_onnx_dir, tmp_path):
    custom = tmp_path / "custom-code"
    shutil.copytree(minilm_dir, custom)
    config = json.loads((custom / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (custom / "config.json").write_text(json.dumps(config))
    (custom / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    models = [{"path": str(custom), "name": "custom", "backend": "torch"}, {"path": str(minilm_onnx_dir), "name": "ok"}]
    with client_for(models=models, allow_degraded=True) as c:
        err = assert_error(c.post("/v1/embeddings", json={"input": "x", "model": "custom"}), 503, "not_ready")
        assert "trust_remote_code" in err["message"]
        assert c.post("/v1/embeddings", json={"input": "x", "model": "ok"}).status_code == 200
