"""The Lambda handler under AWS's own runtime interface client (``python -m awslambdaric handler.handler``,
the Lambda Python base image's entrypoint), in a subprocess against a Runtime API stand-in on loopback
(benchmarks/lambda_runtime.py): events in, responses / invocation errors / init errors out."""

from __future__ import annotations

import importlib.util
import json
import os
import time

import numpy as np
import orjson
import pytest

from benchmarks.lambda_runtime import RuntimeAPI, RuntimeProcess, mapped_files
from tests.adapters.conftest import LAMBDA_HANDLER, int8_spec
from tests.adapters.contract import MODEL
from tests.adapters.events import function_url_event, http_api_event
from tests.support.server import ROOT, socket_inodes

TASK_ROOT = LAMBDA_HANDLER.parent
INIT_TIMEOUT = 120.0

pytestmark = pytest.mark.slow


def _embed(texts, *, make=function_url_event, base64_body=False, **extra) -> dict:
    return make("POST", "/v1/embeddings", orjson.dumps({"input": texts, **extra}), base64_body=base64_body)


def _reply(outcome) -> tuple[int, dict]:
    assert outcome.kind == "response", outcome.body  # an HTTP answer, not a function error
    response = outcome.body
    return response["statusCode"], json.loads(response["body"])


def _assert_error_shape(body: dict) -> dict:
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def _started(env: dict | None = None):
    """A stand-in and the client process on it; init finished (or failed) before it returns."""
    api = RuntimeAPI().__enter__()
    proc = RuntimeProcess(api, TASK_ROOT, ROOT, env)
    return api, proc


@pytest.fixture(scope="module")
def ric():
    """One execution environment: the embedded default model, text logs, 1769 MB."""
    api, proc = _started()
    try:
        assert proc.wait_for_output("init done", INIT_TIMEOUT), proc.stdout + proc.stderr
        yield api, proc
    finally:
        proc.stop()
        api.__exit__()


@pytest.mark.parametrize("make", [function_url_event, http_api_event], ids=["function-url", "http-api"])
def test_events_and_base64_bodies(ric, make):
    api, _ = ric
    texts = ["Le café est très chaud ce matin.", "東京は日本の首都です。"]
    status, plain = _reply(api.invoke(_embed(texts, make=make)))
    assert status == 200 and [len(d["embedding"]) for d in plain["data"]] == [384, 384]
    encoded = _embed(texts, make=make, base64_body=True)
    assert encoded["isBase64Encoded"] is True and "café" not in encoded["body"]
    status, decoded = _reply(api.invoke(encoded))
    assert status == 200
    np.testing.assert_allclose([d["embedding"] for d in decoded["data"]], [d["embedding"] for d in plain["data"]],
                               atol=1e-6)


@pytest.mark.parametrize("body, status, code", [(b'{"input": ["unterminated"', 400, "invalid_json"),
                                                (b'{"input": 5}', 422, None)], ids=["not-json", "wrong-type"])
def test_bad_body_is_an_error_in_the_openai_shape_and_the_environment_stays_up(ric, body, status, code):
    api, proc = ric
    got, reply = _reply(api.invoke(function_url_event("POST", "/v1/embeddings", body)))
    assert got == status
    error = _assert_error_shape(reply)
    assert error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code
    status, _ = _reply(api.invoke(_embed(["still serving"])))
    assert status == 200 and proc.proc.poll() is None


def test_oversized_response_is_a_413_after_inference(ric):
    """1,400 float vectors: under the early estimate (11 bytes a value), over 6 MB once written (~12.2)."""
    api, _ = ric
    outcome = api.invoke(_embed([f"item {i}" for i in range(1400)]))
    status, reply = _reply(outcome)
    assert status == 413
    error = _assert_error_shape(reply)
    assert error["code"] == "response_too_large" and "would be " in error["message"]
    assert "at least" not in error["message"]  # the measured size, not the estimate
    assert len(orjson.dumps(outcome.body)) < 6 * 1024 * 1024  # what reached the Runtime API fits


# What Lambda's 6 MB limit counts is what the runtime client posts: awslambdaric's
# lambda_runtime_marshaller.Encoder (4.2.2) writes non-ASCII as UTF-8 only when AWS_EXECUTION_ENV is one of
# AWS_Lambda_python3.12 ... 3.15 (the managed runtimes, the zip package), and escapes it as \uXXXX everywhere
# else, an image's AWS_Lambda_Image included. A tokenize answer of CJK text: ~5.6 MB as UTF-8, ~6.6 MB escaped.
CJK = "東京都の天気は晴れです。" * 100
LIMIT = 6 * 1024 * 1024


def _cjk_tokenize(inputs: int = 340) -> dict:
    return function_url_event("POST", "/v1/tokenize", orjson.dumps({"input": [CJK] * inputs}))


@pytest.mark.parametrize("execution_env, status", [("AWS_Lambda_Image", 413), ("AWS_Lambda_python3.12", 200)])
def test_response_limit_counts_the_bytes_the_runtime_client_sends(execution_env, status):
    api, proc = _started({"AWS_EXECUTION_ENV": execution_env, "TESSERA_MAX_TOKENS_PER_REQUEST": "1000000"})
    try:
        assert proc.wait_for_output("init done", INIT_TIMEOUT), proc.stdout + proc.stderr
        outcome = api.invoke(_cjk_tokenize())
    finally:
        proc.stop()
        api.__exit__()
    assert outcome.size <= LIMIT, outcome.size  # what reached the Runtime API fits, as sent
    got, reply = _reply(outcome)
    assert got == status, (execution_env, outcome.size, str(reply)[:200])
    if status == 413:  # the measured size is the escaped one: over the limit although its UTF-8 fits
        error = _assert_error_shape(reply)
        assert error["code"] == "response_too_large"
        measured = int(error["message"].split("would be ", 1)[1].split()[0])
        assert measured > LIMIT
    else:  # the same answer sent as UTF-8 fits, and is served
        assert outcome.size > 5_000_000 and len(reply["data"]) == 340


def test_the_fallback_encoder_follows_the_runtime_clients_rule(monkeypatch):
    """Where awslambdaric cannot be imported the handler encodes with the standard library by the same
    AWS_EXECUTION_ENV rule (its UTF8_RUNTIMES): byte for byte what the client's own Encoder writes, for
    every managed Python runtime name and an image's."""
    import json as stdjson

    import awslambdaric.lambda_runtime_marshaller as marshaller

    utf8 = _utf8_runtimes_in_handler()
    sample = {"statusCode": 200, "body": "東京 ünïcode \u2028 \U0001F600 \"quoted\"", "isBase64Encoded": False}
    names = [f"AWS_Lambda_python3.{minor}" for minor in range(8, 17)] + ["AWS_Lambda_Image", ""]
    for value in names:
        monkeypatch.setenv("AWS_EXECUTION_ENV", value)
        client = marshaller.Encoder().encode(sample)
        fallback = stdjson.JSONEncoder(ensure_ascii=value not in utf8, allow_nan=True).encode(sample)
        assert fallback.encode() == client.encode(), value
        assert ("\\u6771" in client) is (value not in utf8), value


def _sockets(pid: int) -> dict[str, list]:
    """The process's open sockets: the remote port of each TCP one, the path of each Unix one ("" for an
    unnamed pair), and any other kind by inode."""
    inodes = socket_inodes(pid)
    tcp = []
    for table in ("tcp", "tcp6"):
        for line in open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                inodes.discard(fields[9])
                tcp.append(int(fields[2].rsplit(":", 1)[1], 16))
    unix = []  # unnamed Unix socket pairs (asyncio's self-pipe per event loop) stay inside the process
    for line in open(f"/proc/{pid}/net/unix").read().splitlines()[1:]:
        fields = line.split()
        if fields[6] in inodes:
            inodes.discard(fields[6])
            unix.append(fields[7] if len(fields) > 7 else "")
    return {"tcp": tcp, "unix": unix, "other": sorted(inodes)}


def _handler_doc() -> str:
    import ast

    return ast.get_docstring(ast.parse(LAMBDA_HANDLER.read_text())) or ""


def _utf8_runtimes_in_handler() -> frozenset:
    import ast

    tree = ast.parse(LAMBDA_HANDLER.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "UTF8_RUNTIMES":
            return frozenset(ast.literal_eval(node.value.args[0]))
    raise AssertionError("UTF8_RUNTIMES not found in the handler")


def test_1500_float_inputs_are_refused_before_computing(ric):
    api, _ = ric
    computed = api.invoke(_embed([f"item {i}" for i in range(1400)], encoding_format="base64"))
    assert _reply(computed)[0] == 200
    refused = api.invoke(_embed([f"item {i}" for i in range(1500)]))
    status, reply = _reply(refused)
    assert status == 413
    error = _assert_error_shape(reply)
    assert error["code"] == "response_too_large" and "at least" in error["message"]
    compute_ms = computed.posted_ms - computed.handed_out_ms
    refuse_ms = refused.posted_ms - refused.handed_out_ms
    assert refuse_ms * 5 < compute_ms, (refuse_ms, compute_ms)  # answered without the model's work


def test_deadline_from_the_invocation_is_a_504_before_the_platform_ends_it(ric):
    api, _ = ric
    texts = [f"sentence {i} " + "about the deadline of a Lambda invocation " * 6 for i in range(300)]
    control = api.invoke(_embed(texts), timeout_ms=120_000)
    assert _reply(control)[0] == 200
    budget_ms = 300  # 1.3 s left at the start, less the handler's 1 s margin
    assert control.posted_ms - control.handed_out_ms > 2 * budget_ms, "the request must outlast the budget"
    outcome = api.invoke(_embed(texts), timeout_ms=1300)
    status, reply = _reply(outcome)
    assert status == 504
    error = _assert_error_shape(reply)
    assert error["code"] == "deadline_exceeded" and error["type"] == "timeout_error"
    assert outcome.posted_ms < outcome.deadline_ms  # answered before Lambda would have ended it
    time.sleep(1.5)  # let the abandoned batch finish before the next test's request
    assert _reply(api.invoke(_embed(["after the timeout"])))[0] == 200


def test_logs_at_info_under_the_runtime_client(ric):
    api, proc = ric
    outcome = api.invoke(_embed(["a logged request"]))
    assert _reply(outcome)[0] == 200
    assert proc.wait_for_output(outcome.request_id, 10)
    lines = proc.stdout.splitlines()
    init = [line for line in lines if "init done in" in line]
    assert len(init) == 1 and init[0].startswith("[INFO]\t"), lines[:10]
    assert any(line.startswith("[INFO]") and f"loaded model 1/1: {MODEL}" in line for line in lines)
    # the client's own format, with the request id on lines logged during an invocation
    assert any(line.startswith("[INFO]") and outcome.request_id in line and "POST /v1/embeddings 200" in line
               for line in lines)


def test_no_torch_in_the_process(ric):
    api, proc = ric
    assert importlib.util.find_spec("torch") is not None, "torch is installed here: its absence is what is tested"
    assert _reply(api.invoke(_embed(["no torch here"])))[0] == 200
    files = mapped_files(proc.proc.pid)
    assert any("onnxruntime" in f for f in files)  # the model is served from this very process
    assert not [f for f in files if "torch" in f.lower()]


@pytest.mark.parametrize("env, shown", [
    ({"AWS_LAMBDA_LOG_FORMAT": "JSON"}, True),
    ({"AWS_LAMBDA_LOG_FORMAT": "JSON", "AWS_LAMBDA_LOG_LEVEL": "WARN", "TESSERA_LOG_LEVEL": "debug"}, False),
    ({"TESSERA_LOG_LEVEL": "warning"}, False),
], ids=["json-info", "json-lambda-level-wins", "text-tessera-level"])
def test_log_format_and_level(env, shown):
    api, proc = _started(env)
    try:
        outcome = api.invoke(_embed(["a logged request"]), timeout=INIT_TIMEOUT)
        assert _reply(outcome)[0] == 200
        time.sleep(0.3)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
    finally:
        proc.stop()
        api.__exit__()
    if env.get("AWS_LAMBDA_LOG_FORMAT") == "JSON":
        records = [json.loads(line) for line in lines]  # every line is one JSON record
        init = [r for r in records if str(r.get("message", "")).startswith("init done in")]
        if shown:
            assert len(init) == 1 and init[0]["level"] == "INFO" and init[0]["logger"] == "tessera.lambda"
            assert "timestamp" in init[0]
            request_lines = [r for r in records if r.get("requestId") == outcome.request_id]
            assert request_lines and request_lines[0]["message"] == "POST /v1/embeddings 200"
            # the access line's fields ride along in Lambda's own JSON record (as its `extra` attributes)
            [access] = [r for r in request_lines if r["logger"] == "tessera.access"]
            fields = access["fields"]
            assert fields["status"] == 200 and fields["route"] == "/v1/embeddings" and fields["inputs"] == 1
            assert fields["tokens"] > 0 and fields["request_id"] and fields["duration_ms"] >= 0
            assert "a logged request" not in json.dumps(records)  # never the input text
        else:
            assert not init and all(r["level"] not in ("INFO", "DEBUG") for r in records)
    else:
        assert not any("init done in" in line for line in lines)
        assert not any(line.startswith(("[INFO]", "[DEBUG]")) for line in lines)


def test_a_model_that_fails_to_load_fails_init(minilm_dir, packaged_int8_onnx, tmp_path):
    models = [int8_spec(minilm_dir, packaged_int8_onnx),
              {"path": str(tmp_path / "no-such-model"), "name": "missing", "backend": "onnx"}]
    api, proc = _started({"TESSERA_MODELS": json.dumps(models)})
    try:
        assert api.wait_init_error(INIT_TIMEOUT), proc.stdout + proc.stderr
        proc.proc.wait(30)
        assert proc.proc.returncode == 1  # the client exits after reporting; Lambda starts a fresh init
        assert api.next_calls == 0  # no invocation was ever asked for
    finally:
        proc.stop()
        api.__exit__()
    [error] = api.init_errors
    assert error["errorType"] == "StartupFailed"
    assert "missing" in error["errorMessage"] and MODEL not in error["errorMessage"].split(":")[0]
    assert api.init_error_headers[0]["Lambda-Runtime-Function-Error-Type"] == "StartupFailed"


def test_a_settings_error_fails_init_with_one_line():
    """A key file that is not there: the init error Lambda reports names it on one line, with no frame of the code
    under the handler (it was a FileNotFoundError from the app's first request, its frames deep in core/)."""
    api, proc = _started({"TESSERA_API_KEYS_FILE": "/nonexistent/keys"})
    try:
        assert api.wait_init_error(INIT_TIMEOUT), proc.stdout + proc.stderr
        proc.proc.wait(30)
        assert proc.proc.returncode == 1 and api.next_calls == 0
    finally:
        proc.stop()
        api.__exit__()
    [error] = api.init_errors
    assert error["errorType"] == "StartupFailed", error
    assert "/nonexistent/keys" in error["errorMessage"] and "\n" not in error["errorMessage"], error
    assert not [frame for frame in error["stackTrace"] if "/core/" in frame], error["stackTrace"]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "init failed: " in line]
    assert len(said) == 1 and "/nonexistent/keys" in said[0], proc.stdout + proc.stderr


#: the shapes that raised inside Mangum: a function error (502 to the caller) instead of an answer
ODD_EVENTS = {
    "x-forwarded-port that is not a port": lambda e: e["headers"].update({"x-forwarded-port": "notaport"}),
    "a host with two colons": lambda e: e["headers"].update(host="a:b:c"),
    "requestContext without http": lambda e: e["requestContext"].pop("http"),
    "cookies with a number": lambda e: e.update(cookies=[1]),
}


@pytest.mark.parametrize("name", list(ODD_EVENTS))
def test_odd_event_shapes_are_a_400_invalid_event(ric, name):
    api, proc = ric
    event = _embed(["odd"])
    ODD_EVENTS[name](event)
    status, reply = _reply(api.invoke(event))
    assert status == 400, reply
    assert _assert_error_shape(reply)["code"] == "invalid_event"
    status, _ = _reply(api.invoke(_embed(["still serving"])))
    assert status == 200 and proc.proc.poll() is None


def test_multi_concurrency_workers_share_the_cpus():
    """AWS_LAMBDA_MAX_CONCURRENCY=2: the client forks two workers, each imports the handler and serves one
    request at a time, with vCPUs // 2 threads."""
    workers = 2
    expected_threads = max(1, len(os.sched_getaffinity(0)) // workers)
    api, proc = _started({"AWS_LAMBDA_MAX_CONCURRENCY": str(workers)})
    try:
        texts = [f"concurrent {i} " + "words to embed " * 10 for i in range(48)]
        pending = [api.submit(_embed(texts), timeout_ms=300_000) for _ in range(6)]
        outcomes = [api.wait(p, INIT_TIMEOUT) for p in pending]
        assert [_reply(o)[0] for o in outcomes] == [200] * 6
        children = proc.children()
        child_files = {pid: mapped_files(pid) for pid in children}
        init_lines = [line for line in proc.stdout.splitlines() if "init done in" in line]
    finally:
        proc.stop()
        api.__exit__()
    assert len(children) == workers
    assert all(any("onnxruntime" in f for f in files) for files in child_files.values())  # a model per worker
    assert len(init_lines) == workers
    assert all(f"{expected_threads} threads, worker pid" in line and f"of {workers}" in line for line in init_lines)
    assert len({line.split("worker pid ")[1].split()[0] for line in init_lines}) == workers
    # two invocations in flight at once, never more
    events = sorted([(o.handed_out_ms, 1) for o in outcomes] + [(o.posted_ms, -1) for o in outcomes],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == workers



def test_on_demand_init_skips_the_warm_up(ric):
    """An on-demand init (no AWS_LAMBDA_INITIALIZATION_TYPE=snap-start) runs no warm-up batches and no hooks."""
    api, proc = ric
    assert _reply(api.invoke(_embed(["first request after an on-demand init"])))[0] == 200
    assert "warmed up on" not in proc.stdout and "before snapshot" not in proc.stdout
    assert api.snapshot_requested.is_set() is False


def test_snap_start_hooks_run_around_the_snapshot(reference):
    """AWS_LAMBDA_INITIALIZATION_TYPE=snap-start: the client runs the before-snapshot hooks after init and then
    asks for /restore/next (held here: the snapshot would be taken now). The model is loaded and warmed up by
    then, and no invocation was asked for; after the restore the after-restore hook runs before the first
    invocation, which is answered with the model's vectors."""
    api = RuntimeAPI(hold_restore=True).__enter__()
    proc = RuntimeProcess(api, TASK_ROOT, ROOT, {"AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start"})
    try:
        assert api.wait_snapshot(INIT_TIMEOUT), proc.stdout + proc.stderr
        time.sleep(0.2)  # the log lines written before the call reach the pipe
        at_snapshot = proc.stdout
        files = mapped_files(proc.proc.pid)
        sockets = _sockets(proc.proc.pid)
        texts = ["Le café est très chaud ce matin.", "restored from a snapshot"]
        pending = api.submit(_embed(texts))
        time.sleep(0.5)
        assert not pending.done.is_set()  # nothing is served before the restore
        api.restore()
        status, body = _reply(api.wait(pending, INIT_TIMEOUT))
        assert proc.wait_for_output(pending.request_id, 10)
        after = proc.stdout
    finally:
        proc.stop()
        api.__exit__()
    assert api.next_calls_at_snapshot == 0 and not api.init_errors and not api.restore_errors
    assert any("onnxruntime" in f for f in files)  # the model's runtime is in the process before the snapshot
    assert f"loaded model 1/1: {MODEL}" in at_snapshot and "init done in" in at_snapshot
    assert "warmed up on" in at_snapshot and "before snapshot: models" in at_snapshot
    assert at_snapshot.index("init done in") < at_snapshot.index("before snapshot: models")
    assert "after restore" not in at_snapshot
    # the warm pass ran at init, before the snapshot (it starts the batchers in the handler's loop), and
    # no connection but the runtime client's own to the Runtime API is open in the snapshot: AWS, "Handle
    # uniqueness with Lambda SnapStart" / network connections made during init may not survive a restore
    assert at_snapshot.index("warm pass: ") < at_snapshot.index("before snapshot: models")
    api_port = int(api.address.rsplit(":", 1)[1])
    assert sockets["other"] == [] and sockets["tcp"] and set(sockets["tcp"]) == {api_port}, sockets
    assert set(sockets["unix"]) <= {""}, sockets
    # and the handler and docs/adapters.md say so (the description agrees with the code)
    for described in (_handler_doc(), (ROOT / "docs/adapters.md").read_text()):
        assert "start on the first request, after restore" not in " ".join(described.split())
        assert "batchers" in described and "before the snapshot" in described
    assert after.index("after restore: random state re-seeded") < after.index(pending.request_id)
    assert status == 200
    got = np.array([d["embedding"] for d in body["data"]])
    cosine = (got * reference(texts)).sum(axis=1)  # both unit vectors
    assert cosine.min() > 0.97, cosine
