"""The request-head limit holds wherever Tessera is started: ``python -m core serve``, ``uvicorn
core.dev:app`` (uvicorn's own defaults: httptools) and SageMaker's ``serve``. Each is a real process on
loopback: a huge header is cut off at ``max_header_bytes`` with 431, and a burst of pipelined requests
(many heads in one read) is answered request by request, not taken for one huge head."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.server import (ROOT, environ_without_settings, free_port, running_process, send_one_huge_header,
                                  uvicorn_command)

ENTRY_POINTS = ("core-serve", "uvicorn-core.dev", "sagemaker-serve")
PIPELINED = 5000
LIMIT = 32768


@pytest.fixture(scope="module", params=ENTRY_POINTS)
def entry_point(request, minilm_onnx_dir):
    port = free_port()
    env = environ_without_settings()
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TESSERA_PORT=str(port), TESSERA_HOST="127.0.0.1",
               TESSERA_MAX_HEADER_BYTES=str(LIMIT),
               TESSERA_MODELS=json.dumps([{"path": str(minilm_onnx_dir), "name": "m", "backend": "onnx"}]))
    if request.param == "core-serve":
        cmd, cwd = [sys.executable, "-m", "core", "serve"], ROOT
    elif request.param == "uvicorn-core.dev":
        cmd, cwd = uvicorn_command("core.dev:app", port), ROOT  # uvicorn's defaults: --http auto (httptools)
    else:
        env["SAGEMAKER_BIND_TO_PORT"] = str(port)
        cmd, cwd = [sys.executable, str(ROOT / "adapters" / "sagemaker" / "serve")], Path("/")
    with running_process(cmd, env, port=port, cwd=cwd, timeout=180, name=f"entry-{request.param}") as (base, proc):
        yield request.param, base, port


def _read_head_and_body(sock: socket.socket) -> tuple[str, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body


def test_a_huge_header_is_cut_off_with_431(entry_point):
    name, base, port = entry_point
    ok = httpx.post(base + "/v1/embeddings", json={"input": "hi"}, headers={"x-pad": "p" * 16000}, timeout=30)
    assert ok.status_code == 200, (name, ok.text)
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sent = send_one_huge_header(sock)
    try:
        assert sent < 8 * 1024 * 1024, f"{name}: the server read {sent} bytes of one header"
        try:
            head, _ = _read_head_and_body(sock)
            assert head.split(" ", 2)[1] == "431", (name, head[:200])
        except ConnectionResetError:
            pass  # the refusal can be lost when the peer resets after unread data; the cut-off is what matters
    finally:
        sock.close()
    line = httpx.post(base + "/v1/embeddings?" + "q" * (LIMIT + 1000), json={"input": "hi"}, timeout=30)
    assert line.status_code == 431, (name, line.status_code)
    assert httpx.get(base + "/health", timeout=30).status_code == 200


def test_pipelined_requests_are_measured_one_head_at_a_time(entry_point):
    """5,000 pipelined 33-byte GETs (165 KB in a few reads) got one 431 and no answers: the limit counted
    the whole received chunk, not one request's head."""
    name, base, port = entry_point
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    assert len(request) == 33
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    received = bytearray()
    done = threading.Event()

    def read() -> None:
        try:
            while received.count(b"HTTP/1.1 ") < PIPELINED:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                received.extend(chunk)
        except OSError:
            pass
        finally:
            done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        sock.sendall(request * PIPELINED)
        assert done.wait(180), f"{name}: {received.count(b'HTTP/1.1 ')} answers after 180 s"
    finally:
        sock.close()
        reader.join(10)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", bytes(received))
    assert len(statuses) == PIPELINED and set(statuses) == {b"200"}, (name, len(statuses), set(statuses))
    started = time.monotonic()
    assert httpx.get(base + "/health", timeout=30).status_code == 200 and time.monotonic() - started < 5
