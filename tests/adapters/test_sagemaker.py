"""SageMaker: /ping before and after load, routing by CustomAttributes and body, content negotiation
(x-npy round trip, 406, 415), SIGTERM drain of a real process, and the boto3 client's request shape."""

from __future__ import annotations

import io
import signal
import threading
import time

import httpx
import numpy as np
import orjson
import pytest

from tests.adapters.conftest import int8_spec, sagemaker_process
from tests.adapters.contract import MODEL, THREE
from tests.support.sentences import LONG

ATTRS = "X-Amzn-SageMaker-Custom-Attributes"


def _invoke(base, body, *, attributes=None, accept="application/json", content_type="application/json"):
    headers = {"Content-Type": content_type, "Accept": accept}
    if attributes is not None:
        headers[ATTRS] = attributes
    payload = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(base + "/invocations", content=payload, headers=headers, timeout=60)


def test_ping_is_503_before_load_and_200_after(minilm_dir, packaged_int8_onnx):
    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from core.config import Settings

    app = create_sagemaker_app(Settings(models=[int8_spec(minilm_dir, packaged_int8_onnx)]))
    client = TestClient(app)
    before = client.get("/ping")  # no lifespan yet: the models are not loaded
    assert before.status_code == 503 and before.json()["error"]["code"] == "not_ready"
    started = time.perf_counter()
    with client:
        after = client.get("/ping")
        assert after.status_code == 200
        assert (time.perf_counter() - started) < 30
        t0 = time.perf_counter()
        for _ in range(20):
            assert client.get("/ping").status_code == 200
        assert (time.perf_counter() - t0) / 20 < 0.1  # SageMaker wants an answer within 2 s


def test_ping_on_the_serve_process(sagemaker_server):
    reply = httpx.get(sagemaker_server + "/ping", timeout=5)
    assert reply.status_code == 200 and reply.json()["status"] == "ready"


def test_custom_attributes_route_and_model(sagemaker_server):
    base = sagemaker_server
    by_attr = _invoke(base, {"input": THREE}, attributes=f"route=embeddings,model={MODEL}")
    by_body = _invoke(base, {"input": THREE, "route": "embeddings"})
    by_default = _invoke(base, {"input": THREE})  # one model, one capability: embeddings
    semicolons = _invoke(base, {"input": THREE}, attributes=f"route = v1/embeddings ; model={MODEL}")
    docs = [r.json() for r in (by_attr, by_body, by_default, semicolons)]
    assert all(r.status_code == 200 for r in (by_attr, by_body, by_default, semicolons))
    vectors = [np.array([d["embedding"] for d in doc["data"]]) for doc in docs]
    for v in vectors[1:]:
        np.testing.assert_allclose(v, vectors[0], atol=1e-6)
    # the model named in the attributes is used (and an unknown one is a 404 in the error shape)
    missing = _invoke(base, {"input": "x"}, attributes="route=embeddings,model=nope")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    # the body's model wins over the attributes
    assert _invoke(base, {"input": "x", "model": MODEL}, attributes="model=nope").status_code == 200
    unknown = _invoke(base, {"input": "x"}, attributes="route=transcribe")
    assert unknown.status_code == 404 and "transcribe" in unknown.json()["error"]["message"]
    # a route that exists, for a model that cannot serve it: 400 naming what the model serves
    wrong = _invoke(base, {"query": "q", "documents": ["a"]}, attributes="route=rerank")
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "unsupported_task"
    assert "embeddings" in wrong.json()["error"]["message"]


def test_npy_round_trip(sagemaker_server):
    as_json = _invoke(sagemaker_server, {"input": THREE}, attributes="route=embeddings")
    as_npy = _invoke(sagemaker_server, {"input": THREE}, attributes="route=embeddings", accept="application/x-npy")
    assert as_npy.status_code == 200 and as_npy.headers["content-type"] == "application/x-npy"
    array = np.load(io.BytesIO(as_npy.content), allow_pickle=False)
    assert array.dtype == np.float32 and array.shape == (3, 384)
    np.testing.assert_allclose(array, np.array([d["embedding"] for d in as_json.json()["data"]]), atol=1e-6)
    assert as_npy.headers["x-tessera-model"] == MODEL
    assert int(as_npy.headers["x-tessera-prompt-tokens"]) == as_json.json()["usage"]["prompt_tokens"]
    assert len(as_npy.content) < len(as_json.content) / 2
    # preference order is honoured; errors stay JSON
    prefers_npy = _invoke(sagemaker_server, {"input": "x"}, accept="application/x-npy, application/json;q=0.5")
    assert prefers_npy.headers["content-type"] == "application/x-npy"
    error = _invoke(sagemaker_server, {"input": []}, accept="application/x-npy")
    assert error.status_code == 400 and error.json()["error"]["code"] == "invalid_input"


@pytest.mark.parametrize("extra", [{}, {"dimensions": 128}, {"embedding_type": "int8"}, {"normalize": False}],
                         ids=["plain", "dimensions", "int8", "unnormalized"])
def test_npy_holds_exactly_the_vectors_of_the_base64_answer(sagemaker_server, extra):
    """x-npy is written from the route's arrays, not from its JSON: byte for byte the .npy of the float32 values
    that the JSON answer's base64 carries (what /invocations wrote when it decoded that answer)."""
    import base64

    body = {"input": [*THREE, "naïve café 東京"], **extra}
    as_npy = _invoke(sagemaker_server, body, attributes="route=embeddings", accept="application/x-npy")
    as_b64 = _invoke(sagemaker_server, {**body, "encoding_format": "base64"}, attributes="route=embeddings").json()
    assert as_npy.status_code == 200
    expected = io.BytesIO()
    np.save(expected, np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in as_b64["data"]]),
            allow_pickle=False)
    assert as_npy.content == expected.getvalue()
    assert as_npy.headers["x-tessera-prompt-tokens"] == str(as_b64["usage"]["prompt_tokens"])


def test_unsupported_media_types(sagemaker_server):
    not_acceptable = _invoke(sagemaker_server, {"input": "x"}, accept="text/csv")
    assert not_acceptable.status_code == 406 and not_acceptable.json()["error"]["code"] == "not_acceptable"
    unsupported = _invoke(sagemaker_server, b"a,b\n", content_type="text/csv")
    assert unsupported.status_code == 415 and unsupported.json()["error"]["code"] == "unsupported_media_type"


def test_sigterm_drains_in_flight_requests(sagemaker_model_dir):
    texts = [f"{i} {LONG}" for i in range(64)]  # 64 inputs of 256 tokens: seconds of work on this CPU
    with sagemaker_process(sagemaker_model_dir) as (base, proc):
        results: dict = {}

        def call():
            try:
                results["reply"] = _invoke(base, {"input": texts}, attributes="route=embeddings")
            except httpx.HTTPError as exc:  # pragma: no cover - reported below
                results["error"] = exc
            results["done"] = time.monotonic()

        worker = threading.Thread(target=call)
        worker.start()
        time.sleep(1.0)  # the request is read and batching has begun
        assert "done" not in results, "the request finished before SIGTERM: make it heavier"
        sigterm_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        worker.join(timeout=60)
        code = proc.wait(timeout=30)
        stopped_at = time.monotonic()
    assert "error" not in results, results.get("error")
    reply = results["reply"]
    assert reply.status_code == 200, reply.text[:300]
    assert len(reply.json()["data"]) == len(texts)
    assert results["done"] > sigterm_at  # it was in flight when the signal came, and still completed
    assert stopped_at - sigterm_at < 30  # inside SageMaker's 30 s before SIGKILL
    assert code in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/ping", timeout=2)


def test_client_request_shape_with_stubber(sagemaker_server):
    """The script's invoke_endpoint call, checked by botocore's Stubber against the service model;
    the stubbed answer is what the real serve process returned for that very request."""
    import boto3
    from botocore.response import StreamingBody
    from botocore.stub import Stubber

    from tests.support.modules import load_script

    script = load_script("invoke_sagemaker")
    client = boto3.client("sagemaker-runtime", region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
    body = {"input": THREE}
    for npy, content_type in ((False, "application/json"), (True, "application/x-npy")):
        params = script.request_params("tessera-endpoint", body, route="embeddings", model=MODEL, npy=npy)
        real = _invoke(sagemaker_server, params["Body"], attributes=params["CustomAttributes"], accept=params["Accept"])
        assert real.status_code == 200 and real.headers["content-type"] == content_type
        with Stubber(client) as stub:
            stub.add_response(
                "invoke_endpoint",
                {"Body": StreamingBody(io.BytesIO(real.content), len(real.content)), "ContentType": content_type,
                 "InvokedProductionVariant": "AllTraffic"},
                expected_params={"EndpointName": "tessera-endpoint", "Body": orjson.dumps(body),
                                 "ContentType": "application/json", "Accept": content_type,
                                 "CustomAttributes": f"route=embeddings,model={MODEL}"},
            )
            result = script.invoke(client, "tessera-endpoint", body, route="embeddings", model=MODEL, npy=npy)
            stub.assert_no_pending_responses()
        if npy:
            assert result.shape == (3, 384) and result.dtype == np.float32
        else:
            assert result["object"] == "list" and result["model"] == MODEL and len(result["data"]) == 3


# --- Batch Transform: JSON Lines mini-batches (SplitType=Line, BatchStrategy=MultiRecord, AssembleWith=Line) --

JSONL = "application/jsonlines"


def test_json_lines_mini_batch_answers_one_line_per_record_in_order(sagemaker_server):
    records = [
        orjson.dumps({"input": THREE[0]}),
        b'{"input": "broken record',                          # not JSON
        orjson.dumps({"input": [THREE[1], THREE[2]]}),         # one record may carry several inputs
        b"",                                                  # an empty line inside the body is a record too
        orjson.dumps({"input": []}),                          # JSON, but invalid for the route
        orjson.dumps({"input": THREE[2], "encoding_format": "float"}),
        orjson.dumps({"input": "x", "route": "transcribe"}),  # a route that does not exist
    ]
    body = b"\n".join(records) + b"\n"  # SageMaker's splitter keeps the newline that ends each record
    reply = _invoke(sagemaker_server, body, content_type=JSONL, accept=JSONL, attributes=None)
    assert reply.status_code == 200, reply.text[:300]
    assert reply.headers["content-type"].startswith(JSONL)
    assert reply.content.endswith(b"\n")
    lines = reply.content.split(b"\n")[:-1]
    assert len(lines) == len(records)
    answers = [orjson.loads(line) for line in lines]
    assert reply.headers["x-tessera-records"] == "7" and reply.headers["x-tessera-failed-records"] == "4"
    single = _invoke(sagemaker_server, {"input": THREE}).json()
    reference = np.array([d["embedding"] for d in single["data"]])
    got = [np.array([d["embedding"] for d in answers[i]["data"]]) for i in (0, 2, 5)]
    np.testing.assert_allclose(got[0], reference[[0]], atol=1e-5)
    np.testing.assert_allclose(got[1], reference[[1, 2]], atol=1e-5)
    np.testing.assert_allclose(got[2], reference[[2]], atol=1e-5)
    assert [d["index"] for d in answers[2]["data"]] == [0, 1]  # indexes are per record
    assert answers[1]["error"]["code"] == "invalid_json" and answers[3]["error"]["code"] == "invalid_json"
    assert answers[4]["error"]["code"] == "invalid_input"
    assert answers[6]["error"]["param"] == "route" and "transcribe" in answers[6]["error"]["message"]
    for broken in (1, 3, 4, 6):
        assert set(answers[broken]["error"]) == {"message", "type", "param", "code"}


def test_json_lines_route_and_model_from_the_attributes(sagemaker_server):
    body = b"\n".join(orjson.dumps({"input": t}) for t in THREE)  # no newline after the last record
    reply = _invoke(sagemaker_server, body, content_type=JSONL, attributes=f"route=embeddings,model={MODEL}")
    lines = reply.content.splitlines()
    assert reply.status_code == 200 and len(lines) == 3
    assert all(orjson.loads(line)["model"] == MODEL for line in lines)
    wrong = _invoke(sagemaker_server, body, content_type=JSONL, attributes="model=nope")
    assert [orjson.loads(line)["error"]["code"] for line in wrong.content.splitlines()] == ["model_not_found"] * 3
    npy = _invoke(sagemaker_server, body, content_type=JSONL, accept="application/x-npy")
    assert npy.status_code == 406 and npy.json()["error"]["code"] == "not_acceptable"
    empty = _invoke(sagemaker_server, b"", content_type=JSONL)
    assert empty.status_code == 400 and empty.json()["error"]["code"] == "invalid_json"


def test_json_lines_many_records_keep_their_order(sagemaker_server):
    texts = [f"document number {i}: " + THREE[i % 3] for i in range(200)]
    body = b"".join(orjson.dumps({"input": t}) + b"\r\n" for t in texts)  # CRLF files split the same way
    reply = _invoke(sagemaker_server, body, content_type=JSONL, attributes="route=embeddings")
    lines = reply.content.splitlines()
    assert reply.status_code == 200 and len(lines) == 200
    check = [0, 57, 199]
    single = _invoke(sagemaker_server, {"input": [texts[i] for i in check]}).json()
    for row, i in enumerate(check):
        np.testing.assert_allclose(orjson.loads(lines[i])["data"][0]["embedding"],
                                   single["data"][row]["embedding"], atol=1e-5)


def test_execution_parameters_for_batch_transform(sagemaker_server):
    reply = httpx.get(sagemaker_server + "/execution-parameters", timeout=5)
    assert reply.status_code == 200
    assert reply.json() == {"MaxConcurrentTransforms": 2, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}


# --- the CUDA image's start chain: entrypoint -> serve; /ping while loading; the response-size guard ------------

def test_entrypoint_starts_serve_and_ping_while_loading(sagemaker_model_dir, tmp_path):
    """`docker run IMAGE serve` on the CUDA image runs `entrypoint serve`: the entrypoint execs `serve` found on
    PATH. Polled from the first moment: the port is closed while the models load (connection refused; never a
    200 before the app is ready), then /ping answers 200."""
    import subprocess
    import sys

    from tests.support.server import ROOT, environ_without_settings, free_port

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "serve").symlink_to(ROOT / "adapters/sagemaker/serve")
    python3 = bin_dir / "python3"  # the image's python3 (the scripts' shebang): this environment's
    python3.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    port = free_port()
    env = environ_without_settings()
    env.update({"PATH": f"{bin_dir}:{env.get('PATH', '')}", "SM_MODEL_DIR": str(sagemaker_model_dir),
                "SAGEMAKER_BIND_TO_PORT": str(port), "TESSERA_HOST": "127.0.0.1", "PYTHONUNBUFFERED": "1",
                "TESSERA_CUDA_COMPAT_DIR": str(tmp_path / "no-compat"),
                "TESSERA_SAGEMAKER_MAX_RESPONSE_BYTES": "20000"})
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen([str(ROOT / "adapters/sagemaker/entrypoint"), "serve"], env=env, cwd="/",
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(base + "/ping", timeout=2).status_code
            except httpx.ConnectError:
                seen.append("refused")
            else:
                seen.append(str(status))
                if status == 200:
                    break
            time.sleep(0.02)
        log.seek(0)
        output = log.read()
        assert seen and seen[-1] == "200", (seen[-5:], output[-2000:])
        assert "refused" in seen and set(seen[:-1]) <= {"refused", "503"}, seen
        assert "tessera entrypoint: no CUDA compat package" in output
        # the response-size guard: 10 float vectors as JSON are ~80 kB, over the 20 kB set here
        big = _invoke(base, {"input": THREE * 4, "encoding_format": "float"}, attributes="route=embeddings")
        assert big.status_code == 413 and big.json()["error"]["code"] == "response_too_large"
        assert "application/x-npy" in big.json()["error"]["message"]
        small = _invoke(base, {"input": THREE[:1]}, attributes="route=embeddings")
        assert small.status_code == 200
        # the entrypoint replaced itself: the server is the process SageMaker started (SIGTERM reaches it)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_response_size_guard_defaults_to_sagemakers_limit():
    from adapters.sagemaker.invocations import SAGEMAKER_MAX_RESPONSE_BYTES, create_sagemaker_app
    from core.config import Settings

    assert SAGEMAKER_MAX_RESPONSE_BYTES == 6 * 1024 * 1024
    assert create_sagemaker_app(Settings()).state.response_limit.max_bytes == SAGEMAKER_MAX_RESPONSE_BYTES
    assert create_sagemaker_app(Settings(), max_response_bytes=0).state.response_limit is None  # Batch Transform


def test_json_lines_overloaded_records_are_retried_not_failed():
    """A record refused with 429 (queue full) is tried again; the order and the other lines are unchanged;
    a record that stays refused past the retry window answers its 429 error line in place."""
    import asyncio

    from adapters.sagemaker.jsonlines import run_records

    refusals = {b"a": 2, b"b": 0, b"c": 10**6}
    calls: list[bytes] = []

    async def run(record: bytes):
        calls.append(record)
        if refusals[record] > 0:
            refusals[record] -= 1
            return 429, b'{"error": {"message": "queue full", "type": "server_error", "param": null, "code": "overloaded"}}'
        return 200, orjson.dumps({"record": record.decode()})

    lines, failed = asyncio.run(run_records([b"a", b"b", b"c"], run, concurrency=2, retry_for_s=0.3,
                                            first_wait_s=0.01))
    assert [orjson.loads(line) for line in lines[:2]] == [{"record": "a"}, {"record": "b"}]
    assert orjson.loads(lines[2])["error"]["code"] == "overloaded" and failed == 1
    assert calls.count(b"a") == 3 and calls.count(b"b") == 1 and calls.count(b"c") > 2


def test_ping_needs_no_api_key_and_invocations_do(minilm_dir, packaged_int8_onnx):
    """SageMaker's health check sends no key: /ping is the adapter's health path; /invocations and the
    core routes still need one; the plain app knows nothing of /ping."""
    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from core.api.app import create_app
    from core.config import Settings

    settings = Settings(models=[int8_spec(minilm_dir, packaged_int8_onnx)], api_keys=["k1"])
    with TestClient(create_sagemaker_app(settings)) as client:
        assert client.get("/ping").status_code == 200
        body = {"input": ["a"], "route": "embeddings"}
        assert client.post("/invocations", json=body).status_code == 401
        assert client.post("/invocations", json=body, headers={"Authorization": "Bearer k1"}).status_code == 200
    with TestClient(create_app(settings)) as plain:
        assert plain.get("/ping").status_code == 401


def test_a_model_that_fails_to_load_keeps_ping_at_503(tmp_path):
    """SageMaker has a health check: the server stays up and /ping says why it is not ready (elsewhere
    the same failure ends the start-up)."""
    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from core.config import Settings

    settings = Settings(models=[{"path": str(tmp_path / "missing"), "name": "gone"}])
    with TestClient(create_sagemaker_app(settings)) as client:
        ping = client.get("/ping")
        assert ping.status_code == 503 and "gone" in ping.json()["error"]["message"]
        assert client.get("/health").status_code == 200


def test_start_up_warm_pass_covers_invocations_and_counts_nothing(minilm_dir, packaged_int8_onnx, caplog):
    import logging

    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from adapters.sagemaker.invocations import warm_requests
    from core.config import Settings

    caplog.set_level(logging.INFO, logger="tessera.warm_pass")
    settings = Settings(models=[int8_spec(minilm_dir, packaged_int8_onnx)], api_keys=["k"])
    with TestClient(create_sagemaker_app(settings)) as client:
        sent = warm_requests(client.app.state.registry)
        assert [(r.path, dict(r.headers)) for r in sent][-1] == ("/invocations", {ATTRS.lower().encode(): b"route=embeddings"})
        assert f"warm pass: {len(sent)} of {len(sent)} requests answered 2xx" in caplog.text  # with a key configured
        metrics = client.get("/metrics", headers={"Authorization": "Bearer k"}).text
        counted = [line for line in metrics.splitlines()
                   if line.startswith("tessera_requests_total{") and not line.endswith(" 0.0")]
        assert counted == []



def test_a_sparse_model_alone_is_the_default_route(splade_dir):
    """One sparse model served: a request naming no route goes to /v1/embeddings/sparse (the route of its one
    main capability, ``embeddings_sparse``), as one embedding model's goes to /v1/embeddings."""
    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from core.config import Settings

    settings = Settings(models=[{"path": str(splade_dir), "name": "splade", "backend": "torch"}])
    with TestClient(create_sagemaker_app(settings)) as client:
        by_default = client.post("/invocations", json={"input": ["a cat sat", "on the mat"]})
        named = client.post("/invocations", json={"input": ["a cat sat", "on the mat"]},
                            headers={ATTRS: "route=embeddings/sparse"})
    assert by_default.status_code == 200, by_default.text
    data = by_default.json()["data"]
    assert [item["object"] for item in data] == ["sparse_embedding"] * 2
    assert by_default.json()["data"] == named.json()["data"]

# --- SageMaker's own limits: Batch Transform's payload size, InvokeEndpoint's 60 s ------------------------------

def _batch_transform_environment(max_payload_mb: int) -> dict[str, str]:
    """The variables SageMaker gives a Batch Transform container, as the SageMaker Python SDK's local mode
    builds them (``sagemaker.core.local.entities._LocalTransformJob._get_container_environment``; AWS,
    "How containers serve requests" for batch transform: SAGEMAKER_MAX_PAYLOAD_IN_MB "is set to the
    largest size payload that is sent to the container via HTTP")."""
    from sagemaker.core.local.entities import _LocalTransformJob

    job = _LocalTransformJob.__new__(_LocalTransformJob)
    job.primary_container = {"Environment": {}}
    return job._get_container_environment(MaxPayloadInMB=max_payload_mb, BatchStrategy="MultiRecord")


def test_batch_transform_payload_size_is_read(sagemaker_model_dir):
    """A job created with MaxPayloadInMB=12 sends mini-batches of up to 12 MB: the container takes them
    (the core's default body limit is 8 MiB, which answered 413 to every such mini-batch)."""
    env = _batch_transform_environment(12)
    assert env["SAGEMAKER_MAX_PAYLOAD_IN_MB"] == "12" and env["SAGEMAKER_BATCH"] == "True"
    # 10 MiB of JSON Lines (over 8 MiB, under 12 MB) in 2,000 records, within the per-request item limit
    record = orjson.dumps({"input": "x" * 5200}) + b"\n"
    body = record * 2000
    assert 8 * 1024 * 1024 < len(body) < 12 * 1000 * 1000
    with sagemaker_process(sagemaker_model_dir, env) as (base, _proc):
        reply = httpx.post(base + "/invocations", content=body, timeout=600, headers={
            "Content-Type": "application/jsonlines", "Accept": "application/jsonlines",
            ATTRS: "route=tokenize"})
        assert reply.status_code != 413, reply.text[:300]
        assert reply.status_code == 200, reply.text[:300]
        assert int(reply.headers["x-tessera-records"]) == body.count(b"\n")
        over = httpx.post(base + "/invocations", content=record * (13 * 1024 * 1024 // len(record)), timeout=600,
                          headers={"Content-Type": "application/jsonlines", ATTRS: "route=tokenize"})
        assert over.status_code == 413  # past what the job may send: still refused, by the body's size
        assert over.json()["error"]["code"] == "body_too_large"


def test_payload_size_only_raises_the_body_limit():
    from adapters.sagemaker.models import sagemaker_settings
    from core.errors import ConfigError

    assert sagemaker_settings({}).max_request_bytes == 8 * 1024 * 1024
    assert sagemaker_settings({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "6"}).max_request_bytes == 8 * 1024 * 1024
    assert sagemaker_settings({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "100"}).max_request_bytes == 100 * 1024 * 1024
    with pytest.raises(ConfigError, match="SAGEMAKER_MAX_PAYLOAD_IN_MB"):
        sagemaker_settings({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "lots"})


def test_request_deadline_lands_before_invoke_endpoints_timeout():
    """InvokeEndpoint's own documentation (botocore's model of sagemaker-runtime): "A customer's model
    containers must respond to requests within 60 seconds." A deadline of 60 s races SageMaker's; the
    container's must come first, with time left to send its 504."""
    import re

    import botocore.session

    from adapters.sagemaker.models import sagemaker_settings

    doc = botocore.session.get_session().get_service_model("sagemaker-runtime").operation_model(
        "InvokeEndpoint").documentation
    limit = float(re.search(r"must respond to requests within (\d+) seconds", doc).group(1))
    timeout = sagemaker_settings({}).request_timeout_s
    assert timeout <= limit - 5, timeout
    assert sagemaker_settings({"TESSERA_REQUEST_TIMEOUT_S": "20"}).request_timeout_s == 20  # still settable
    # Batch Transform: the job's invocation timeout applies (ModelClientConfig.InvocationsTimeoutInSeconds,
    # "The default value is 600" in botocore's model), and its responses have no 6 MB limit
    batch = sagemaker_settings(_batch_transform_environment(6))
    default = re.search(r"default value is (\d+)", botocore.session.get_session().get_service_model(
        "sagemaker").shape_for("ModelClientConfig").members["InvocationsTimeoutInSeconds"].documentation)
    assert batch.request_timeout_s <= float(default.group(1)) - 5 and batch.request_timeout_s > limit
    assert batch.sagemaker_max_response_bytes == 0


def test_npy_takes_the_routes_arrays_without_encoding_them(minilm_dir, packaged_int8_onnx, monkeypatch):
    """In-process: an x-npy answer never goes through the route's JSON encoder (the route hands its arrays over
    through core.api.asgi_call); the response limit applies to what /invocations sends: 12 vectors as JSON
    are over it (413 after the work), as x-npy (18 kB) they fit."""
    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from core.api.embeddings import routes as embeddings_route
    from core.config import Settings

    settings = Settings(models=[int8_spec(minilm_dir, packaged_int8_onnx)])
    with TestClient(create_sagemaker_app(settings, max_response_bytes=20_000)) as client:
        def no_json(*args, **kwargs):
            raise AssertionError("the JSON encoder ran for an x-npy answer")

        with monkeypatch.context() as patched:
            patched.setattr(embeddings_route, "openai_embeddings", no_json)
            npy = client.post("/invocations", json={"input": THREE * 4}, headers={"Accept": "application/x-npy"})
        assert npy.status_code == 200 and np.load(io.BytesIO(npy.content)).shape == (12, 384)
        big = client.post("/invocations", json={"input": THREE * 4})
        error = big.json()["error"]
        assert big.status_code == 413 and error["code"] == "response_too_large" and "at least" not in error["message"]
        assert "application/x-npy" in error["message"]


def test_a_records_answer_becomes_one_line():
    """The app's compact JSON answer is the record's line as it is; an answer spread over lines is re-encoded
    onto one; a body that is not JSON becomes an error line in the error shape."""
    from adapters.sagemaker.jsonlines import as_line

    compact = orjson.dumps({"object": "list", "data": [{"embedding": [0.5, -1.25]}]})
    assert as_line(200, compact) is compact
    assert as_line(200, b'{\n  "a": [1,\r\n 2]\n}') == b'{"a":[1,2]}'
    broken = orjson.loads(as_line(502, b"<html>bad gateway</html>"))
    assert broken["error"]["code"] == "internal_error" and "502" in broken["error"]["message"]


@pytest.mark.parametrize("content_type", ["application/json", "application/jsonlines"])
def test_a_client_that_leaves_cancels_the_work_it_carried(minilm_dir, packaged_int8_onnx, monkeypatch, content_type):
    """The client's disconnect reaches the route that /invocations runs in-process (one watcher on the client,
    each inner request's receive waits on it): the model's work for it, single or per record, is cancelled."""
    import asyncio

    from starlette.testclient import TestClient

    from adapters.sagemaker import create_sagemaker_app
    from core.api import asgi_call
    from core.config import Settings
    from core.engine import Engine

    events: list[str] = []

    async def held(self, request, **kwargs):
        events.append("started")
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    records = 2 if content_type == JSONL else 1
    body = b'{"input": "a"}\n{"input": "b"}\n' if content_type == JSONL else b'{"input": ["a", "b"]}'

    async def leave_midway(app) -> None:
        gone = asyncio.get_running_loop().create_future()
        scope = asgi_call.new_scope("POST", "/invocations", [(b"host", b"test")])
        sent = asyncio.ensure_future(asgi_call.call(app, scope, body, content_type=content_type.encode(),
                                                    disconnected=gone))
        for _ in range(3000):  # up to 30 s for the work to start
            if events.count("started") == records:
                break
            await asyncio.sleep(0.01)
        gone.set_result(None)
        await asyncio.wait_for(sent, 30)

    settings = Settings(models=[int8_spec(minilm_dir, packaged_int8_onnx)])
    with TestClient(create_sagemaker_app(settings)) as client:
        monkeypatch.setattr(Engine, "__call__", held)
        client.portal.call(leave_midway, client.app)
    assert events == ["started"] * records + ["cancelled"] * records
