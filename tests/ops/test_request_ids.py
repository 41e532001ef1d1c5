"""Request ids on every answer (the caller's, made safe, or a new one), the access line's fields, and
the refusal metrics by reason, in-process over the real ONNX MiniLM."""

from __future__ import annotations

import concurrent.futures
import logging
import re

import pytest

from core.api.observability import MAX_REQUEST_ID, request_id
from tests.api.conftest import SlowBackend, assert_error, client_for

KEY = "sk-ids-test-key-0b7d"
SECRET = "a sentence about Ophelia-7f3a the zebra"
AUTH = {"Authorization": f"Bearer {KEY}"}


def rejected(client, reason: str) -> float:
    text = client.get("/metrics", headers=AUTH).text
    match = re.search(rf'^tessera_rejected_requests_total{{reason="{reason}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def client(minilm_onnx_dir):
    models = [{"path": str(minilm_onnx_dir), "name": "minilm", "max_queue_items": 4, "max_batch_size": 2}]
    with client_for(models=models, api_keys=[KEY], max_request_bytes=4096, max_items_per_request=8) as c:
        yield c


def test_the_callers_id_is_echoed_made_safe_or_replaced():
    assert request_id([(b"x-request-id", b"abc-123_XYZ.9:z")]) == "abc-123_XYZ.9:z"
    assert request_id([(b"x-request-id", b"ab c\r\n<script>\"'\x00")]) == "abcscript"
    assert len(request_id([(b"x-request-id", b"a" * 10_000)])) == MAX_REQUEST_ID
    generated = {request_id([(b"x-request-id", b"<<>>")]), request_id([])}
    assert len(generated) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", g) for g in generated)



def test_new_ids_do_not_repeat_in_a_forked_child():
    """A forked worker (gunicorn, multiprocessing's fork) starts from its parent's generator state: its new ids
    must still differ from the parent's."""
    import os

    ids = {request_id([]) for _ in range(10_000)}
    assert len(ids) == 10_000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, "".join(request_id([]) for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = pipe.read().decode()
    os.waitpid(pid, 0)
    child_ids = [child[i:i + 32] for i in range(0, len(child), 32)]
    parent_ids = [request_id([]) for _ in range(4)]
    assert len(child_ids) == 4 and all(re.fullmatch(r"[0-9a-f]{32}", c) for c in child_ids)
    assert not set(child_ids) & (set(parent_ids) | ids)

def test_every_answer_carries_the_id(client, caplog):
    caplog.set_level(logging.INFO, logger="tessera.access")
    r = client.post("/v1/embeddings", json={"input": [SECRET, "x"]}, headers={**AUTH, "X-Request-Id": "ok<1>"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "ok1"
    (line,) = [rec for rec in caplog.records if rec.name == "tessera.access" and rec.fields["request_id"] == "ok1"]
    f = line.fields
    assert (f["method"], f["route"], f["status"], f["model"], f["inputs"]) == ("POST", "/v1/embeddings", 200, "minilm", 2)
    assert f["tokens"] > 4 and f["duration_ms"] > 0
    assert SECRET not in line.getMessage() and KEY not in str(f)

    answers = {
        "401": client.post("/v1/embeddings", json={"input": "x"}, headers={"X-Request-Id": "e401"}),
        "404": client.get("/nowhere", headers={**AUTH, "X-Request-Id": "e404"}),
        "422": client.post("/v1/embeddings", json={"input": 5}, headers={**AUTH, "X-Request-Id": "e422"}),
        "413": client.post("/v1/embeddings", content=b"{" + b" " * 5000 + b"}",
                           headers={**AUTH, "X-Request-Id": "e413", "Content-Type": "application/json"}),
        "413 items": client.post("/v1/embeddings", json={"input": ["x"] * 9}, headers={**AUTH, "X-Request-Id": "e413i"}),
    }
    for label, r in answers.items():
        status = int(label.split()[0])
        assert_error(r, status)
        assert r.headers["x-request-id"] == {"413 items": "e413i"}.get(label, f"e{status}"), label
    assert re.fullmatch(r"[0-9a-f]{32}", client.get("/health").headers["x-request-id"])


def test_refusals_are_counted_by_reason(client):
    before = {reason: rejected(client, reason) for reason in
              ("unauthorized", "body_too_large", "too_large", "queue_full", "inflight_limit", "timeout")}
    assert client.post("/v1/embeddings", json={"input": "x"}).status_code == 401
    assert client.post("/v1/embeddings", content=b"[" + b"1," * 3000 + b"1]", headers=AUTH).status_code == 413
    assert client.post("/v1/embeddings", json={"input": ["x"] * 9}, headers=AUTH).status_code == 413
    engine = client.app.state.registry.engines["minilm"]
    engine.backend = SlowBackend(engine.backend, 0.3)
    try:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda i: client.post("/v1/embeddings", json={"input": [f"t{i}"] * 2},
                                                          headers={**AUTH, "X-Request-Id": f"q{i}"}), range(12)))
        full = [r for r in answers if r.status_code == 429]
        assert full and all(r.headers["x-request-id"].startswith("q") for r in full)
        r = client.post("/v1/embeddings", json={"input": "x"}, headers={**AUTH, "X-Request-Timeout": "0.05",
                                                                        "X-Request-Id": "late"})
        assert_error(r, 504) and r.headers["x-request-id"] == "late"
    finally:
        engine.backend = engine.backend.inner
    after = {reason: rejected(client, reason) for reason in before}
    assert after["unauthorized"] == before["unauthorized"] + 1
    assert after["body_too_large"] == before["body_too_large"] + 1
    assert after["too_large"] == before["too_large"] + 1
    assert after["queue_full"] == before["queue_full"] + len(full)
    assert after["timeout"] == before["timeout"] + 1
    assert after["inflight_limit"] == before["inflight_limit"]


def test_in_flight_cap_refusal_is_its_own_reason(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}], max_inflight_requests=1) as c:
        engine = c.app.state.registry.engines["m"]
        engine.backend = SlowBackend(engine.backend, 0.4)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda i: c.post("/v1/embeddings", json={"input": f"t{i}"}), range(4)))
        refused = [r for r in answers if r.status_code == 429]
        assert refused and all(re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]) for r in refused)
        text = c.get("/metrics").text
        assert f'tessera_rejected_requests_total{{reason="inflight_limit"}} {float(len(refused))}' in text
        assert "tessera_inflight_requests 0.0" in text


def test_model_load_failures_are_counted(minilm_onnx_dir, tmp_path):
    models = [{"path": str(minilm_onnx_dir), "name": "good"}, {"path": str(tmp_path / "missing"), "name": "bad"}]
    with client_for(models=models, allow_degraded=True) as c:  # serve the good one despite the bad
        text = c.get("/metrics").text
    assert 'tessera_model_load_failures_total{model="bad"} 1.0' in text
    assert "tessera_models_loaded 1.0" in text


FORGED = "2026-12-05 00:00:00,000 CRITICAL tessera: FORGED admin login"


@pytest.mark.parametrize("auth", [True, False], ids=["no-key", "with-key"])
def test_control_characters_are_escaped_in_every_text_log_field(client, auth):
    """A path with CR/LF (percent-encoded, decoded by the server) must not write a line of its own into
    the default text log: every control character of the message and of each field is escaped."""
    import io

    from core.logs import TEXT_FORMAT, TextFormatter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter(TEXT_FORMAT))
    access = logging.getLogger("tessera.access")
    access.addHandler(handler)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        path = "/nope%0D%0A" + FORGED.replace(" ", "%20") + "%1b[2J%00%E2%80%A8x"
        client.get(path, headers=AUTH if auth else {})
        logging.getLogger("tessera.test").addHandler(handler)
        logging.getLogger("tessera.test").warning("model %s failed", "bad\nname\x85\u2028")
    finally:
        access.removeHandler(handler)
        logging.getLogger("tessera.test").removeHandler(handler)
        access.setLevel(level)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert not any(line.startswith("2026-12-05 00:00:00,000 CRITICAL") for line in lines)
    assert "path=/nope\\r\\n2026-12-05 00:00:00,000 CRITICAL" in lines[0] and "\\x1b[2J\\x00\\u2028x" in lines[0]
    assert lines[1].endswith("model bad\\nname\\x85\\u2028 failed")
    assert all(ch.isprintable() for line in lines for ch in line)
