"""The new backends behind the HTTP API: a ct2 model serves, models whose backend cannot load fail
alone with the fix in the OpenAI error shape, and /v1/models shows what each model runs on."""

from __future__ import annotations

import numpy as np
import pytest

from tests.api.conftest import assert_error, client_for
from tests.backends.test_neuron_boundary import absent_only


@pytest.fixture(scope="module")
def mixed(minilm_ct2_dir, minilm_static_buckets_dir, minilm_dir):
    models = [
        {"path": str(minilm_ct2_dir), "name": "minilm-ct2", "dtype": "int8"},  # auto → ct2
        {"path": str(minilm_static_buckets_dir), "name": "on-neuron"},  # auto → neuron, extra absent here
        {"path": str(minilm_dir), "name": "torch-fp16", "backend": "torch", "dtype": "float16"},
        {"path": str(minilm_dir), "name": "minilm", "backend": "torch"},
    ]
    with client_for(models=models, allow_degraded=True) as client:  # two of them fail to load, on purpose
        yield client


def test_models_list_shows_backends(mixed):
    cards = {m["id"]: m for m in mixed.get("/v1/models").json()["data"]}
    assert set(cards) == {"minilm-ct2", "minilm"}
    assert cards["minilm-ct2"]["backend"] == "ct2" and cards["minilm-ct2"]["compute_type"] == "int8"


def test_ct2_model_serves_close_to_torch(mixed):
    texts = ["The cat sits on the mat.", "Quarterly revenue grew by four percent."]
    a = mixed.post("/v1/embeddings", json={"model": "minilm-ct2", "input": texts})
    b = mixed.post("/v1/embeddings", json={"model": "minilm", "input": texts})
    assert a.status_code == 200 and b.status_code == 200
    va = np.array([d["embedding"] for d in a.json()["data"]])
    vb = np.array([d["embedding"] for d in b.json()["data"]])
    assert (va * vb).sum(axis=1).min() > 0.98


@pytest.mark.parametrize("model,fix", [
    pytest.param("on-neuron", "pip install -e '.[neuron]'", marks=absent_only),
    ("torch-fp16", "float16 on CPU is not supported"),
])
def test_failed_backend_answers_with_the_fix(mixed, model, fix):
    r = mixed.post("/v1/embeddings", json={"model": model, "input": "hello"})
    assert_error(r, 503)
    assert fix in r.json()["error"]["message"]
