"""The contract suite: every case of tests/adapters/contract.py on every surface."""

from __future__ import annotations

import pytest

from tests.adapters.conftest import lambda_send, sagemaker_send, asgi_send
from tests.adapters.contract import CASES, run_case

ids = [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_local_app(case, local_client, reference):
    run_case(case, asgi_send(local_client), reference)


@pytest.mark.parametrize("kind", ["function-url", "http-api"])
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_lambda_handler(case, kind, lambda_module, reference):
    run_case(case, lambda_send(lambda_module, kind), reference)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_sagemaker_serve(case, sagemaker_server, reference):
    run_case(case, sagemaker_send(sagemaker_server), reference)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_modal_app(case, modal_client, reference):
    run_case(case, asgi_send(modal_client), reference)
