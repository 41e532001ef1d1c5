"""After an unexpected exception (a bug, injected by tests/support/faulty_app.py) the server still answers
in the error shape and keeps the keep-alive connection usable: the client's next request on the same
connection is served. A real uvicorn process, one raw HTTP/1.1 connection (http.client, no retries)."""

from __future__ import annotations

import http.client
import json
import os

import pytest

from tests.support.faulty_app import FAULT_WORD
from tests.support.server import free_port, running_process, uvicorn_command


@pytest.fixture(scope="module")
def faulty_server(minilm_onnx_dir):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TESSERA_MODELS": json.dumps([{"path": str(minilm_onnx_dir), "name": "m", "backend": "onnx"}])}
    # the HTTP implementation scripts/serve runs
    cmd = uvicorn_command("tests.support.faulty_app:app", port, "--loop", "uvloop", "--http", "httptools")
    with running_process(cmd, env, port=port, name="faulty") as (base, _):
        yield port


def _post(conn: http.client.HTTPConnection, text: str):
    conn.request("POST", "/v1/embeddings", body=json.dumps({"input": text}),
                 headers={"content-type": "application/json"})
    response = conn.getresponse()
    return response, json.loads(response.read())


def test_an_unexpected_exception_keeps_the_connection_alive(faulty_server):
    conn = http.client.HTTPConnection("127.0.0.1", faulty_server, timeout=30)
    try:
        response, body = _post(conn, "fine")
        assert response.status == 200
        sock = conn.sock
        response, body = _post(conn, f"this will {FAULT_WORD}")
        assert response.status == 500
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "internal_error" and "RuntimeError" in body["error"]["message"]
        assert (response.getheader("connection") or "").lower() != "close"
        for _ in range(3):  # the same socket keeps serving
            response, body = _post(conn, "still fine")
            assert response.status == 200 and len(body["data"]) == 1
            assert conn.sock is sock
    finally:
        conn.close()
