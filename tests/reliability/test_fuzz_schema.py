"""Schema fuzzing of the live server: schemathesis generates requests from the served OpenAPI schema
(valid and invalid bodies, every operation), sent to a real server process on loopback. No answer may
be a 5xx; every error has the error shape. (schemathesis' pytest plugin does not load under pytest 9,
so each operation's hypothesis strategy is driven here.)"""

from __future__ import annotations

import json

import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings

from tests.support.server import environ_without_settings, running_server

EXAMPLES = 25


@pytest.fixture(scope="module")
def live(minilm_onnx_dir):
    env = environ_without_settings()
    env["TESSERA_MODELS"] = json.dumps([{"path": str(minilm_onnx_dir), "name": "minilm"}])
    env["TESSERA_REQUEST_TIMEOUT_S"] = "20"
    with running_server(env) as base:
        yield base, schemathesis.openapi.from_url(base + "/openapi.json")


def check(case, base: str) -> None:
    response = case.call(base_url=base, timeout=30)
    where = f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, (where, body)
        assert {"message", "type", "param", "code"} <= set(body["error"]), (where, body)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_every_operation_answers_without_5xx_and_in_the_error_shape(live, mode):
    """POSITIVE: bodies the schema accepts; NEGATIVE: bodies that break it (wrong types, missing fields)."""
    base, schema = live
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, "the schema lists the API's operations"
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # nothing to break in an operation without inputs (GET /health, ...)
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def fuzz(case):
            check(case, base)

        fuzz()
