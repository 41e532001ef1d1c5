"""The SageMaker server (``adapters/sagemaker/serve``, as the container runs it) with JSON logs: every
line one JSON object, one access line per invocation with the model, inputs and tokens, never the input."""

from __future__ import annotations

import json
import time

import httpx
import orjson

from tests.adapters.conftest import sagemaker_process
from tests.support.server import ROOT

SECRET = "the words Ophelia-7f3a the zebra wrote"


def test_json_logs_under_the_sagemaker_server(sagemaker_model_dir):
    with sagemaker_process(sagemaker_model_dir, {"TESSERA_LOG_FORMAT": "json"}) as (base, _proc):
        r = httpx.post(base + "/invocations", content=orjson.dumps({"input": [SECRET, "second"]}),
                       headers={"Content-Type": "application/json", "X-Request-Id": "sm-json-1"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == "sm-json-1"
        time.sleep(0.2)
        port = base.rsplit(":", 1)[1]
        text = (ROOT / ".venv" / f"test-sagemaker-{port}.log").read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # each line must parse
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    (access,) = [line for line in lines if line.get("request_id") == "sm-json-1" and line["logger"] == "tessera.access"]
    assert (access["method"], access["path"], access["status"], access["inputs"]) == ("POST", "/invocations", 200, 2)
    assert access["model"] and access["tokens"] > 4
    assert "Ophelia" not in text
