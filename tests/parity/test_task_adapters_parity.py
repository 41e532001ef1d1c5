"""Task adapters per request (jina-embeddings-v3's LoRA tasks: retrieval.query, retrieval.passage, separation,
classification, text-matching) on a tiny jina-v3-style model with its own code: the request's ``task`` selects
the adapter as the model's code does (``adapter_mask``: one task index per row) on torch, and through the
``task_id`` input of the graph ``scripts/export_onnx.py --trust-remote-code`` writes (as the model's published
graph takes it) on ONNX. The reference is the model's own code run by transformers (mean pooling, normalized, as
its sentence-transformers modules say), per task and with the task's prompt."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.tasks.embed import EmbedRequest
from tests.parity.test_custom_code_parity import jina_dir, jina_onnx_dir, jina_reference  # noqa: F401 (fixtures)
from tests.support.engines import run_concurrently
from tests.support.family_models import JINA_PROMPTS, JINA_TASKS

MIN_COSINE, MAX_ABS = 0.99999, 1e-5


@pytest.fixture(scope="session")
def task_reference(jina_dir, sentences):  # noqa: F811
    """(task, prompt applied) → the model's own code's vectors."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(jina_dir))
    model = AutoModel.from_pretrained(str(jina_dir), trust_remote_code=True).eval()
    assert type(model).__name__ == "LoRAXLMRoberta"
    cache = {}

    def get(task: str, prompted: bool = False) -> np.ndarray:
        if (task, prompted) not in cache:
            texts = [JINA_PROMPTS[task] + t for t in sentences] if prompted else list(sentences)
            batch = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
            index = torch.full((len(texts),), JINA_TASKS.index(task), dtype=torch.long)
            with torch.inference_mode():
                hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               adapter_mask=index).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
            cache[task, prompted] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return cache[task, prompted]

    return get


@pytest.fixture(scope="session")
def engines(jina_dir, jina_onnx_dir):  # noqa: F811
    folders = {"torch": jina_dir, "onnx": jina_onnx_dir}
    built = {}

    def get(backend: str) -> Engine:
        if backend not in built:
            spec = ModelSpec(path=folders[backend], backend=backend, trust_remote_code=True)
            built[backend] = Engine.load(spec, Settings(threads=2))
        return built[backend]

    return get


def _check(got, ref, what):
    cos, diff = (got * ref).sum(1), np.abs(got - ref).max()
    print(f"\n[parity] jina-v3-style {what}: max abs diff {diff:.2e}, min cosine {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE and diff <= MAX_ABS, f"{what}: worst cosine {cos.min():.7f}"


@pytest.mark.parametrize("task", JINA_TASKS)
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_each_task_matches_the_models_own_code(engines, task_reference, sentences, backend, task):
    engine = engines(backend)
    assert engine.describe()["tasks"] == JINA_TASKS
    prompted = bool(JINA_PROMPTS[task])
    request = EmbedRequest(texts=sentences, task=task, prompt_name=task if prompted else None)
    _check(engine.run_sync(request).vectors, task_reference(task, prompted), f"{backend} task={task}")


def test_tasks_give_different_vectors(task_reference):
    """The check can tell the adapters apart: a task's vectors are far from another's."""
    worst = min(float((task_reference(a) * task_reference(b)).sum(1).min())
                for a in JINA_TASKS for b in JINA_TASKS if a < b)
    assert worst < 0.95


def test_torch_without_a_task_runs_the_models_default(engines, jina_reference, sentences):  # noqa: F811
    """No task: the model's code chooses (this one: its default_lora_task), as sentence-transformers runs it."""
    got = engines("torch").run_sync(EmbedRequest(texts=sentences[:8])).vectors
    np.testing.assert_allclose(got, jina_reference[:8], atol=MAX_ABS)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_concurrent_requests_of_different_tasks_batch_apart(engines, task_reference, sentences, backend):
    engine = engines(backend)
    requests = [EmbedRequest(texts=[sentences[i]], task=JINA_TASKS[i % len(JINA_TASKS)]) for i in range(20)]
    results = run_concurrently(engine, requests)
    for i, result in enumerate(results):
        np.testing.assert_allclose(result.vectors[0], task_reference(JINA_TASKS[i % len(JINA_TASKS)])[i],
                                   atol=2e-5)


def test_bad_task_requests_are_refused_by_name(engines, minilm_dir):
    with pytest.raises(InvalidInput, match=r"unknown task 'retrieval'.*'retrieval.query'"):
        engines("torch").run_sync(EmbedRequest(texts=["x"], task="retrieval"))
    with pytest.raises(InvalidInput, match=r"set 'task' to one of \['retrieval.query'"):
        engines("onnx").run_sync(EmbedRequest(texts=["x"]))
    plain = Engine.load(ModelSpec(path=minilm_dir, backend="torch"), Settings(threads=2), warm_up=False)
    with pytest.raises(InvalidInput, match="this model has none"):
        plain.run_sync(EmbedRequest(texts=["x"], task="retrieval.query"))


def test_task_field_over_http(jina_onnx_dir, task_reference, sentences):  # noqa: F811
    spec = ModelSpec(path=jina_onnx_dir, name="jina", backend="onnx", trust_remote_code=True)
    with TestClient(create_app(Settings(models=[spec], threads=2))) as client:
        r = client.post("/v1/embeddings", json={"model": "jina", "input": sentences[:4], "task": "separation"})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, task_reference("separation")[:4], atol=MAX_ABS)
        bad = client.post("/v1/embeddings", json={"model": "jina", "input": "x", "task": "summarize"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "task"
        missing = client.post("/v1/embeddings", json={"model": "jina", "input": "x"})
        assert missing.status_code == 400 and "retrieval.passage" in missing.json()["error"]["message"]
        card = next(m for m in client.get("/v1/models").json()["data"] if m["id"] == "jina")
        assert card["tasks"] == JINA_TASKS


def test_task_on_a_model_of_another_task_is_refused_over_http(colbert_dir):
    """A multi-vector model has no adapters: the field is refused, not ignored."""
    with TestClient(create_app(Settings(models=[ModelSpec(path=colbert_dir, name="colbert")], threads=2))) as client:
        r = client.post("/v1/embeddings", json={"model": "colbert", "input": "x", "task": "retrieval.query"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "task", r.text
