"""One real ``python -m core serve`` as an operator would run it behind a proxy: JSON logs, a root path
and a URL prefix, CORS, tight head/body limits, two models given as one-line specs on the command line."""

from __future__ import annotations

import json
import socket
import time

import httpx
import numpy as np
import pytest

from tests.ops.conftest import cli_server

KEY = "sk-served-key-31aa"
AUTH = {"Authorization": f"Bearer {KEY}"}
SECRET = "what Ophelia-7f3a the zebra said"
APP = "https://app.example.com"


@pytest.fixture(scope="module")
def served(minilm_onnx_dir):
    int8 = minilm_onnx_dir / "onnx" / "model_int8.onnx"
    args = [
        "--model", f"path={minilm_onnx_dir},name=plain,backend=onnx,onnx_file={int8},dtype=int8",
        "--model", f"path={minilm_onnx_dir}, name=query, backend=onnx, onnx_file={int8}, dtype=int8, "
                   f"\"prompt=query, please: \", max_batch_size=8",
        "--log-format", "json", "--root-path", "/api", "--url-prefix", "/v2", "--cors-origins", APP,
        "--api-key", KEY, "--max-header-bytes", "8192", "--request-body-timeout-s", "0.5",
    ]
    with cli_server(args, ready_path="/v2/ready", headers=AUTH, name="ops-served") as (base, log):
        yield base, log


def _lines(log) -> list[dict]:
    text = log.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return parsed


def _raw(base: str, data: bytes, wait_s: float = 10.0) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(data)
        answer = b""
        deadline = time.monotonic() + wait_s
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_one_line_model_specs_name_backend_dtype_and_prompt(served):
    base, _ = served
    models = {m["id"]: m for m in httpx.get(f"{base}/v2/v1/models", headers=AUTH).json()["data"]}
    assert set(models) == {"plain", "query"}
    assert models["query"]["backend"] == "onnx" and models["query"]["dtype"] == "int8"

    def embed(model, text):
        r = httpx.post(f"{base}/v2/v1/embeddings", json={"model": model, "input": text}, headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        return np.array(r.json()["data"][0]["embedding"])

    with_prompt = embed("query", "hello there")
    assert np.allclose(with_prompt, embed("plain", "query, please: hello there"), atol=1e-5)
    assert not np.allclose(with_prompt, embed("plain", "hello there"), atol=1e-3)


def test_prefix_routes_open_health_and_docs_behind_the_root_path(served):
    base, _ = served
    assert httpx.get(f"{base}/v2/health").status_code == 200  # open path, under the prefix, no key
    assert httpx.get(f"{base}/v2/v1/models").status_code == 401
    outside = httpx.get(f"{base}/v1/models", headers=AUTH)
    assert outside.status_code == 404 and "/v2/" in outside.json()["error"]["message"]
    spec = httpx.get(f"{base}/v2/openapi.json", headers=AUTH).json()
    assert spec["servers"][0]["url"] == "/api/v2" and "/v1/embeddings" in spec["paths"]
    docs = httpx.get(f"{base}/v2/docs", headers=AUTH)
    assert docs.status_code == 200 and "/api/v2/openapi.json" in docs.text


def test_cors_preflight_without_key_and_unlisted_origins_never_echoed(served):
    base, _ = served
    asked = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-api-key"}
    r = httpx.options(f"{base}/v2/v1/embeddings", headers={"Origin": APP, **asked})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == APP
    allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-api-key"} <= allowed
    assert "POST" in r.headers["access-control-allow-methods"]
    call = httpx.post(f"{base}/v2/v1/embeddings", json={"model": "plain", "input": "x"}, headers={"Origin": APP, **AUTH})
    assert call.status_code == 200 and call.headers["access-control-allow-origin"] == APP
    assert "x-request-id" in call.headers["access-control-expose-headers"]

    evil = "https://evil.example.com"
    r = httpx.options(f"{base}/v2/v1/embeddings", headers={"Origin": evil, **asked})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cors_origin_not_allowed"
    assert "access-control-allow-origin" not in r.headers
    call = httpx.post(f"{base}/v2/v1/embeddings", json={"model": "plain", "input": "x"}, headers={"Origin": evil, **AUTH})
    assert call.status_code == 200
    assert "access-control-allow-origin" not in call.headers and evil not in str(call.headers)


def test_header_and_body_limit_answers_carry_the_request_id(served):
    base, _ = served
    big = (b"GET /v2/health HTTP/1.1\r\nHost: x\r\nX-Request-Id: big-head-1\r\nX-Pad: " + b"p" * 9000 + b"\r\n\r\n")
    answer = _raw(base, big)
    assert answer.startswith(b"HTTP/1.1 431") and b"x-request-id: big-head-1\r\n" in answer.lower()
    slow = (b"POST /v2/v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 40\r\nX-Request-Id: slow-body-1\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\n\r\n{\"input\":")
    answer = _raw(base, slow)
    assert answer.startswith(b"HTTP/1.1 408") and b"x-request-id: slow-body-1\r\n" in answer.lower()


def test_json_logs_every_line_an_object_one_access_line_per_request(served):
    base, log = served
    r = httpx.post(f"{base}/v2/v1/embeddings", json={"model": "plain", "input": [SECRET, "two"]},
                   headers={**AUTH, "X-Request-Id": "json-log-1"}, timeout=30)
    assert r.status_code == 200
    refused = httpx.post(f"{base}/v2/v1/embeddings", json={"input": SECRET}, headers={"X-Request-Id": "json-log-2"})
    assert refused.status_code == 401
    time.sleep(0.2)
    lines = _lines(log)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line["logger"].startswith("uvicorn") for line in lines), "uvicorn's own lines are JSON too"
    (ok,) = [line for line in lines if line.get("request_id") == "json-log-1"]
    assert ok["logger"] == "tessera.access"
    assert (ok["method"], ok["route"], ok["path"], ok["status"]) == ("POST", "/v1/embeddings", "/v2/v1/embeddings", 200)
    assert (ok["model"], ok["inputs"]) == ("plain", 2) and ok["tokens"] > 4 and ok["duration_ms"] > 0
    (no,) = [line for line in lines if line.get("request_id") == "json-log-2"]
    assert no["status"] == 401 and no["error"] == "invalid_api_key" and no["model"] is None
    text = log.read_text()
    assert "Ophelia" not in text and KEY not in text


def test_json_logs_under_uvicorn_core_dev_app(minilm_onnx_dir):
    """``uvicorn core.dev:app``: uvicorn set up its own logging before the app was imported."""
    from tests.support.server import ROOT, running_server

    env = {"TESSERA_LOG_FORMAT": "json", "TESSERA_MODELS": json.dumps([{"path": str(minilm_onnx_dir), "name": "m"}]),
           "TESSERA_THREADS": "2"}
    with running_server(env) as base:
        r = httpx.post(f"{base}/v1/embeddings", json={"input": SECRET}, headers={"X-Request-Id": "dev-json-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "dev-json-1"
        time.sleep(0.2)
        lines = _lines(ROOT / ".venv" / f"test-server-{base.rsplit(':', 1)[1]}.log")
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    (access,) = [line for line in lines if line.get("request_id") == "dev-json-1"]
    assert access["model"] == "m" and access["inputs"] == 1
    assert not [line for line in lines if "Ophelia" in json.dumps(line)]
