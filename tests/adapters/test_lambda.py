"""Lambda: init once, base64 bodies, the 413 over the payload limit, threads from memory, no torch."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import numpy as np
import orjson
import pytest

from core.collector import YOUNG_OBJECTS
from tests.adapters.conftest import LAMBDA_HANDLER, invoke
from tests.adapters.contract import MODEL
from tests.adapters.events import function_url_event, http_api_event
from tests.support.server import ROOT


def _embed_event(texts, *, base64_body=False, make=function_url_event, **extra):
    return make("POST", "/v1/embeddings", orjson.dumps({"input": texts, **extra}), base64_body=base64_body)


def test_init_once_second_invocation_does_not_reload(lambda_module, monkeypatch):
    from core.engine import Engine, Registry

    first = invoke(lambda_module, _embed_event(["first call"]))
    assert first.status == 200
    registry = lambda_module.registry
    engine = registry.engines[MODEL]
    batcher_task = engine.batcher._task
    assert batcher_task is not None and not batcher_task.done()

    def no_reload(*args, **kwargs):
        raise AssertionError("a second invocation must not load models again")

    monkeypatch.setattr(Engine, "load", no_reload)
    monkeypatch.setattr(Registry, "from_settings", no_reload)
    second = invoke(lambda_module, _embed_event(["second call"], make=http_api_event))
    assert second.status == 200
    assert lambda_module.registry is registry and registry.engines[MODEL] is engine
    assert engine.batcher._task is batcher_task  # the same batcher, alive across invocations


@pytest.mark.parametrize("make", [function_url_event, http_api_event], ids=["function-url", "http-api"])
def test_base64_request_body(lambda_module, make):
    texts = ["Le café est très chaud ce matin.", "東京は日本の首都です。"]
    plain = invoke(lambda_module, _embed_event(texts, make=make)).json()
    encoded_event = _embed_event(texts, make=make, base64_body=True)
    assert encoded_event["isBase64Encoded"] is True and "café" not in encoded_event["body"]
    reply = invoke(lambda_module, encoded_event)
    assert reply.status == 200
    got = np.array([d["embedding"] for d in reply.json()["data"]])
    want = np.array([d["embedding"] for d in plain["data"]])
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_response_over_6mb_is_a_clear_413(lambda_module):
    assert lambda_module.settings.lambda_max_response_bytes == 6 * 1024 * 1024
    texts = [f"item {i}" for i in range(2000)]  # 2000 × 384 floats as JSON text ≈ 9 MB
    reply = invoke(lambda_module, _embed_event(texts))
    assert reply.status == 413
    error = reply.json()["error"]
    assert error["code"] == "response_too_large" and error["type"] == "invalid_request_error"
    assert "payload limit" in error["message"] and "base64" in error["message"]
    # the advice works: the same inputs as base64 fit
    small = invoke(lambda_module, _embed_event(texts, encoding_format="base64"))
    assert small.status == 200 and len(small.json()["data"]) == 2000


def test_function_settings_come_from_the_environment_given(lambda_module):
    from core.config import ConfigError

    settings = lambda_module.lambda_settings({"TESSERA_LAMBDA_MAX_RESPONSE_BYTES": "1000000",
                                              "TESSERA_LAMBDA_DEADLINE_MARGIN_S": "2.5"})
    assert (settings.lambda_max_response_bytes, settings.lambda_deadline_margin_s) == (1_000_000, 2.5)
    # Lambda itself refuses more than 6 MB: a larger limit is a configuration error, named on one line
    with pytest.raises(ConfigError, match="lambda_max_response_bytes"):
        lambda_module.lambda_settings({"TESSERA_LAMBDA_MAX_RESPONSE_BYTES": str(7 * 1024 * 1024)})
    with pytest.raises(ConfigError, match="lambda_deadline_margin_s"):
        lambda_module.lambda_settings({"TESSERA_LAMBDA_DEADLINE_MARGIN_S": "soon"})


@pytest.mark.parametrize("name", ["TESSERA_LAMBDA_MAX_RESPONSE_BYTES", "TESSERA_LAMBDA_DEADLINE_MARGIN_S"])
@pytest.mark.parametrize("value", ["-1", "0", "1e20", "inf", "nan"])
def test_the_functions_own_numeric_settings_have_finite_ranges(lambda_module, name, value):
    """Each of the function's own numeric settings refuses what no function could use, with its name."""
    from core.config import ConfigError

    if name.endswith("MARGIN_S") and value == "0":
        assert lambda_module.lambda_settings({name: value}).lambda_deadline_margin_s == 0  # no margin: allowed
        return
    with pytest.raises(ConfigError, match=name.removeprefix("TESSERA_").lower()):
        lambda_module.lambda_settings({name: value})


def test_every_numeric_setting_of_the_function_is_in_the_range_test(lambda_module):
    """A numeric setting added to the function's own without a case above fails here."""
    from core.config import Settings

    own = set(lambda_module.LambdaSettings.model_fields) - set(Settings.model_fields)
    numeric = {n for n in own if lambda_module.LambdaSettings.model_fields[n].annotation in (int, float)}
    assert numeric == {"lambda_max_response_bytes", "lambda_deadline_margin_s"}


def test_threads_follow_configured_memory(lambda_module):
    assert lambda_module.settings.threads == 2  # the fixture's 3008 MB
    for memory, vcpus in [(128, 1), (1769, 1), (1770, 2), (3008, 2), (5307, 3), (10240, 6)]:
        settings = lambda_module.lambda_settings({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory)})
        assert settings.threads == vcpus, memory
    settings = lambda_module.lambda_settings({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "10240", "TESSERA_THREADS": "3"})
    assert settings.threads == 3


def test_configured_models_are_onnx_only(lambda_module, minilm_dir):
    from core.errors import InvalidInput

    # the embedded default too runs one session, though the fixture's 3008 MB gives 2 threads
    assert [s.onnx.workers for s in lambda_module.settings.models] == [1]
    assert [e.backend.lanes for e in lambda_module.registry.engines.values()] == [1]

    settings = lambda_module.lambda_settings({"TESSERA_MODELS": json.dumps(
        [{"path": str(minilm_dir), "name": "m"}, {"path": str(minilm_dir), "name": "w", "workers": 2}])})
    assert [s.backend for s in settings.models] == ["onnx", "onnx"]
    # one session per model unless asked (cold start and memory); an explicit workers is kept
    assert [s.onnx.workers for s in settings.models] == [1, 2]
    with pytest.raises(InvalidInput, match="ONNX only"):
        lambda_module.lambda_settings({"TESSERA_MODELS": json.dumps([{"path": str(minilm_dir), "backend": "torch"}])})


NO_TORCH = r"""
import gc, importlib.abc, importlib.util, json, sys

class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(f"torch is blocked in this process ({name})")
        return None

sys.meta_path.insert(0, BlockTorch())
from tests.adapters.events import function_url_event, LambdaContext
spec = importlib.util.spec_from_file_location("handler", sys.argv[1])
handler = importlib.util.module_from_spec(spec)
spec.loader.exec_module(handler)
event = function_url_event("POST", "/v1/embeddings", json.dumps({"input": ["no torch here"]}).encode())
response = handler.handler(event, LambdaContext())
body = json.loads(response["body"])
print(json.dumps({"status": response["statusCode"], "dim": len(body["data"][0]["embedding"]),
                  "torch_loaded": "torch" in sys.modules,
                  "backend": handler.registry.engines["all-MiniLM-L6-v2"].backend.describe()["backend"],
                  "init_frozen": gc.get_freeze_count() > 0, "young_threshold": gc.get_threshold()[0]}))
"""


def test_handler_serves_where_torch_is_not_importable(tmp_path):
    assert importlib.util.find_spec("torch") is not None, "torch is installed here: the block is what is tested"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"}
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(LAMBDA_HANDLER)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # init's objects out of the collector's walks (core/collector.py), as the servers' lifespans do
    assert result == {"status": 200, "dim": 384, "torch_loaded": False, "backend": "onnx", "init_frozen": True,
                      "young_threshold": YOUNG_OBJECTS}


def test_coldstart_script_reports_time_and_rss():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "coldstart_lambda.py"), "--runs", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "first response" in done.stdout and "peak RSS" in done.stdout and "torch loaded: False" in done.stdout
    assert re.search(r"first request \d+ ms", done.stdout)


def test_api_key_auth_through_the_function_url(monkeypatch):
    from tests.support.modules import load_by_path

    monkeypatch.setenv("TESSERA_API_KEYS", '["secret-key"]')
    module = load_by_path("tessera_lambda_handler_auth", LAMBDA_HANDLER)
    try:
        denied = invoke(module, _embed_event(["x"]))
        assert denied.status == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        event = _embed_event(["x"])
        event["headers"]["authorization"] = "Bearer secret-key"
        assert invoke(module, event).status == 200
        assert invoke(module, function_url_event("GET", "/health")).status == 200  # open for health checks
        # an answer that cannot fit is refused only for a request the app lets in (its 401 comes first)
        oversized = _embed_event([f"item {i}" for i in range(1500)])
        assert invoke(module, oversized).status == 401
        oversized["headers"]["authorization"] = "Bearer secret-key"
        refused = invoke(module, oversized)
        assert refused.status == 413 and "at least" in refused.json()["error"]["message"]
    finally:
        module.loop.run_until_complete(module.registry.stop(drain=False))
        module.loop.close()


def test_ensure_started_is_once_per_loop_and_refuses_a_second_loop(minilm_dir, packaged_int8_onnx):
    import asyncio

    from core.config import ModelSpec, Settings
    from core.engine import Registry

    spec = ModelSpec(path=minilm_dir, backend="onnx", dtype="int8", onnx_file=packaged_int8_onnx)
    registry = Registry.from_settings(Settings(models=[spec]))
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(registry.ensure_started())
        task = registry.engines[spec.served_name].batcher._task
        loop.run_until_complete(registry.ensure_started())
        assert registry.engines[spec.served_name].batcher._task is task  # no second start
        with pytest.raises(RuntimeError, match="another event loop"):
            asyncio.run(registry.ensure_started())
    finally:
        loop.run_until_complete(registry.stop(drain=False))
        loop.close()


def test_threads_per_worker_in_multi_concurrency_mode(lambda_module):
    threads_for = lambda_module.threads_for
    assert threads_for({"AWS_LAMBDA_MAX_CONCURRENCY": "4"}, cpus=8) == 2
    assert threads_for({"AWS_LAMBDA_MAX_CONCURRENCY": "3"}, cpus=8) == 2
    assert threads_for({"AWS_LAMBDA_MAX_CONCURRENCY": "16"}, cpus=8) == 1
    # the memory rule is standard Lambda's; a multi-concurrency environment counts its own vCPUs
    assert threads_for({"AWS_LAMBDA_MAX_CONCURRENCY": "1", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"}, cpus=4) == 4
    assert threads_for({"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "3008"}, cpus=64) == 2
    assert threads_for({"AWS_LAMBDA_MAX_CONCURRENCY": "4", "TESSERA_THREADS": "3"}, cpus=8) is None
    settings = lambda_module.lambda_settings({"AWS_LAMBDA_MAX_CONCURRENCY": "2"})
    assert settings.threads == max(1, lambda_module.available_cpus() // 2)


def test_answer_that_cannot_fit_is_refused_before_inference(lambda_module, monkeypatch):
    from core.engine import Engine

    calls = []
    original = Engine.__call__

    async def counted(self, request, **kwargs):
        calls.append(len(request.texts or ()))
        return await original(self, request, **kwargs)

    monkeypatch.setattr(Engine, "__call__", counted)
    texts = [f"item {i}" for i in range(1500)]
    refused = invoke(lambda_module, _embed_event(texts))
    assert refused.status == 413 and calls == []  # the model never saw the request
    error = refused.json()["error"]
    assert error["code"] == "response_too_large" and "at least" in error["message"]
    # the same count fits as base64, and narrower vectors fit as floats: both are computed
    assert invoke(lambda_module, _embed_event(texts, encoding_format="base64")).status == 200
    assert invoke(lambda_module, _embed_event(texts, dimensions=128)).status == 200
    assert calls == [1500, 1500]


def test_deadline_from_the_remaining_time(lambda_module):
    """The app's time_left option caps each request's deadline at the invocation's remaining time less the
    margin (Mangum puts the context in the scope); a client's own shorter X-Request-Timeout still counts, and
    one the app cannot read is still the app's 400."""
    from tests.adapters.events import LambdaContext

    left = lambda_module.time_left(1.0)
    assert left({"aws.context": LambdaContext()}) == 29.0 and left({}) is None  # no invocation: no cap

    class Ending(LambdaContext):
        def get_remaining_time_in_millis(self) -> int:
            return 1000  # less the 1 s margin: nothing left

    texts = [f"sentence {i}" for i in range(64)]
    ending = lambda_module.handler(_embed_event(texts), Ending())
    assert ending["statusCode"] == 504 and orjson.loads(ending["body"])["error"]["code"] == "deadline_exceeded"
    asked = _embed_event(texts)
    asked["headers"]["X-Request-Timeout"] = "0.001"  # shorter than the 29 s the invocation leaves
    assert invoke(lambda_module, asked).status == 504
    asked["headers"]["X-Request-Timeout"] = "soon"
    unreadable = lambda_module.handler(asked, Ending())
    assert unreadable["statusCode"] == 400 and "x-request-timeout" in orjson.loads(unreadable["body"])["error"]["message"]
    assert invoke(lambda_module, _embed_event(["after the deadlines"])).status == 200


def test_the_answer_is_encoded_once_and_sent_as_encoded(lambda_module):
    """The handler measures the JSON the runtime client writes and hands that very encoding over: the client's
    marshaller writes it as it is (no second encoding), and it is the response read as a mapping."""
    from awslambdaric.lambda_runtime_marshaller import Encoder, LambdaMarshaller

    from tests.adapters.events import LambdaContext

    response = lambda_module.handler(_embed_event(["Le café est très chaud"]), LambdaContext())
    assert isinstance(response, lambda_module.Encoded) and response["statusCode"] == 200
    written, content_type = LambdaMarshaller().marshal_response(response)
    assert content_type == "application/json" and written is response.encoded_json
    assert written == Encoder().encode(dict(response))  # what the client would have written for the dict


def test_the_documented_one_line_invocation_runs_as_written():
    """docs/adapters.md's local one-liner, run exactly as the page prints it, from the project root."""
    page = (ROOT / "docs" / "adapters.md").read_text()
    [command] = re.findall(r'`(\.venv/bin/python -c "import importlib\.util as u, json[^`]*)`', page)
    command = command.replace(".venv/bin/python", sys.executable, 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "AWS_LAMBDA_"))}
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "200", done.stdout[-2000:]


@pytest.mark.parametrize("env, warmed", [({}, 0), ({"TESSERA_LAMBDA_WARM_UP": "true"}, 1)], ids=["default", "asked"])
def test_on_demand_init_warms_up_only_when_asked(monkeypatch, env, warmed):
    """No warm-up batches on an on-demand init unless TESSERA_LAMBDA_WARM_UP says so (docs/adapters.md)."""
    from core.engine import Engine
    from tests.support.modules import load_by_path

    calls = []
    real = Engine.warm_up
    monkeypatch.setattr(Engine, "warm_up", lambda self: calls.append(self.name) or real(self))
    monkeypatch.delenv("AWS_LAMBDA_INITIALIZATION_TYPE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    module = load_by_path(f"tessera_lambda_handler_warm_{warmed}", LAMBDA_HANDLER)
    try:
        assert calls == ["all-MiniLM-L6-v2"] * warmed
        assert invoke(module, _embed_event(["x"])).status == 200
    finally:
        module.loop.run_until_complete(module.registry.stop(drain=False))
        module.loop.close()


def test_init_runs_the_warm_pass_uncounted_and_starts_the_batchers(minilm_dir, packaged_int8_onnx, monkeypatch):
    """At init, before any invocation: the app's warm pass ran in the handler's loop (the batchers live
    there), with an API key configured, and /metrics counts no request from it."""
    from tests.support.modules import load_by_path

    monkeypatch.setenv("TESSERA_API_KEYS", '["secret-key"]')
    module = load_by_path("tessera_lambda_handler_warm", LAMBDA_HANDLER)
    try:
        engine = module.registry.engines[MODEL]
        assert module.registry._loop is module.loop and engine.batcher._task is not None
        event = function_url_event("GET", "/metrics")
        event["headers"]["authorization"] = "Bearer secret-key"
        metrics = invoke(module, event)
        assert metrics.status == 200
        counted = [line for line in metrics.body.decode().splitlines()
                   if line.startswith(("tessera_requests_total{", "tessera_batch_size_count{"))
                   and not line.endswith(" 0.0")]
        assert counted == []
        assert 'tessera_requests_total{route="/v1/embeddings",status="200"} 0.0' in metrics.body.decode()
    finally:
        module.loop.run_until_complete(module.registry.stop(drain=False))
        module.loop.close()


def _malformed(change):
    event = _embed_event(["hello"])
    change(event)
    return event


def _drop_request_context(event):
    event.pop("requestContext")


MALFORMED_EVENTS = {
    "a model that is a list": lambda e: e.update(body=orjson.dumps({"model": ["x"], "input": "a"}).decode()),
    "a model that is an object": lambda e: e.update(body=orjson.dumps({"model": {"a": 1}, "input": "a"}).decode()),
    "invalid base64 body": lambda e: e.update(body="not base64 at all!", isBase64Encoded=True),
    "a body that is not a string": lambda e: e.update(body={"input": "a"}),
    "a list-valued header": lambda e: e["headers"].update(authorization=["Bearer a", "Bearer b"]),
    "a header that is a number": lambda e: e["headers"].update(**{"x-request-timeout": 5}),
    "headers that are a list": lambda e: e.update(headers=[["content-type", "application/json"]]),
    "no requestContext": _drop_request_context,
    "not an HTTP event at all": lambda e: e.clear(),
}


@pytest.mark.parametrize("name", list(MALFORMED_EVENTS))
def test_every_event_gets_a_response_in_the_error_shape(lambda_module, name):
    """A malformed event (or a body the early checks could not read) answers a 4xx in the error shape; it
    never raises (a function error: 502 to the caller, before the API key is even checked)."""
    reply = invoke(lambda_module, _malformed(MALFORMED_EVENTS[name]))
    assert 400 <= reply.status < 500, (reply.status, reply.body)
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert invoke(lambda_module, _embed_event(["still serving"])).status == 200


def test_a_malformed_body_is_refused_after_the_api_key_check(monkeypatch):
    """Without the key, a request whose body the early refusal cannot read gets the 401 like any other."""
    from tests.support.modules import load_by_path

    monkeypatch.setenv("TESSERA_API_KEYS", '["secret-key"]')
    module = load_by_path("tessera_lambda_handler_auth_malformed", LAMBDA_HANDLER)
    try:
        event = _embed_event(["x"])
        event["body"] = orjson.dumps({"model": ["x"], "input": "a"}).decode()
        denied = invoke(module, event)
        assert denied.status == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        event["headers"]["authorization"] = "Bearer secret-key"
        assert invoke(module, event).status == 422
    finally:
        module.loop.run_until_complete(module.registry.stop(drain=False))
        module.loop.close()


INIT_FAILS = """
import sys
from tests.support.modules import load_by_path
load_by_path("tessera_lambda_handler", __import__("pathlib").Path(sys.argv[1]))
"""


@pytest.mark.parametrize("setting, value, named", [
    ("TESSERA_API_KEYS_FILE", "/nonexistent/keys", "/nonexistent/keys"),
    ("TESSERA_API_KEYS_FILE", "/dev/null", "no API key"),
    ("TESSERA_PORT", "not-a-port", "TESSERA_PORT"),
    ("TESSERA_MODELS", '[{"path": "/nonexistent/model", "backend": "onnx"}]', "/nonexistent/model"),
], ids=["missing-key-file", "empty-key-file", "bad-setting", "missing-model"])
def test_init_fails_with_one_line_naming_the_reason(tmp_path, setting, value, named):
    """Init on a setting it cannot serve with: one log line saying why, the error Lambda reports on one line, no
    frame of the code under the handler; not a traceback from inside the app (a key file read by the first
    request of the warm pass) with the batchers' tasks destroyed pending at exit."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769", setting: value}
    done = subprocess.run([sys.executable, "-c", INIT_FAILS, str(LAMBDA_HANDLER)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "init failed: " in line]
    assert len(said) == 1 and named in said[0], done.stderr[-3000:]
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("core.errors.StartupFailed: ") and named in last, done.stderr[-3000:]
    frames = re.findall(r'File "([^"]+)"', done.stderr)
    assert not [f for f in frames if f.startswith(str(ROOT / "core"))], done.stderr[-3000:]
    assert "Task was destroyed" not in done.stderr and "Logging error" not in done.stderr, done.stderr[-3000:]
