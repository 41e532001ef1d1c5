"""In-process apps over the real models (TestClient runs the lifespan: models load, batchers start)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import Settings


@contextmanager
def client_for(**settings):
    settings.setdefault("threads", 2)
    with TestClient(create_app(Settings(**settings))) as client:
        yield client


@pytest.fixture(scope="session")
def two_models(minilm_dir, minilm_onnx_dir):
    """One app serving MiniLM twice: torch (served as 'minilm') and ONNX fp32 ('minilm-onnx')."""
    models = [
        {"path": str(minilm_dir), "name": "minilm", "backend": "torch"},
        {"path": str(minilm_onnx_dir), "name": "minilm-onnx", "backend": "onnx"},
    ]
    with client_for(models=models) as client:
        yield client


@pytest.fixture(scope="session")
def one_model(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "minilm"}]) as client:
        yield client


class SlowBackend:
    """Wraps a real backend: each batch first sleeps (fault injection for deadlines and overload)."""

    def __init__(self, inner, delay: float):
        self.inner, self.delay = inner, delay
        self.name, self.max_batch_size = inner.name, inner.max_batch_size

    def run(self, inputs):
        time.sleep(self.delay)
        return self.inner.run(inputs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def assert_error(response, status: int, code: str | None = None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err
