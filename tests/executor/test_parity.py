"""Results through an executor process equal the in-process engine's, for every kind of item and result that
crosses (token arrays and their chunking windows, pooled and per-token vectors, scores, logits, sparse and
multi-vector results), and a batch equals its items sent one by one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.engine import Registry
from core.executor import ExecutorSet, remote_registry
from core.tasks.chunking import ChunkOptions, LateChunkOptions
from core.tasks.classify import ClassifyRequest
from core.tasks.embed import EmbedRequest
from core.tasks.late_interaction import MaxSimRequest
from core.tasks.rerank import RerankRequest
from tests.executor.conftest import running, settings_for

TEXTS = ["the cat sat on the mat", "a quick brown fox jumps over the lazy dog near the river bank", "hi",
         "serving engines batch many requests together", "shared memory crosses between processes"]
LONG = " ".join(TEXTS * 6)


@pytest.fixture(scope="module")
def specs(minilm_onnx_dir, reranker_dir, classifier_dir, splade_dir, colbert_dir):
    return [
        {"path": minilm_onnx_dir, "name": "emb", "backend": "onnx"},
        {"path": reranker_dir, "name": "rr", "backend": "torch"},
        {"path": classifier_dir, "name": "cls", "backend": "torch"},
        {"path": splade_dir, "name": "sp", "backend": "torch"},
        {"path": colbert_dir, "name": "colbert", "backend": "torch"},
    ]


@pytest.fixture(scope="module")
def executors(specs):
    executors = ExecutorSet.start(settings_for(*[{**s, "device": "cpu:0"} for s in specs]))
    yield executors
    executors.stop(timeout=10.0)


@pytest.fixture(scope="module")
def local(specs):
    registry = Registry.from_settings(settings_for(*[{**s, "device": "cpu"} for s in specs]))
    yield registry


def requests():
    return {
        "embed": ("emb", lambda: EmbedRequest(texts=list(TEXTS))),
        "embed dimensions, not normalized": ("emb", lambda: EmbedRequest(texts=list(TEXTS), dimensions=64,
                                                                         normalize=False)),
        "embed per token": ("emb", lambda: EmbedRequest(texts=list(TEXTS[:3]), output="tokens")),
        "embed chunked": ("emb", lambda: EmbedRequest(texts=[LONG, "short one"],
                                                      chunking=ChunkOptions(size=32, overlap=8))),
        "embed late chunking": ("emb", lambda: EmbedRequest(texts=list(TEXTS), late_chunking=LateChunkOptions())),
        "rerank": ("rr", lambda: RerankRequest(query="what sat on the mat", documents=list(TEXTS))),
        "classify": ("cls", lambda: ClassifyRequest(texts=list(TEXTS))),
        "sparse": ("sp", lambda: EmbedRequest(texts=list(TEXTS), output="sparse")),
        "multi-vector": ("colbert", lambda: EmbedRequest(texts=list(TEXTS), input_type="query")),
        "maxsim": ("colbert", lambda: MaxSimRequest(query="cat on a mat", documents=list(TEXTS))),
    }


def assert_same(remote, reference, path="result"):
    """Same result, field by field (arrays within float tolerance: batches pad differently)."""
    if isinstance(reference, np.ndarray):
        assert isinstance(remote, np.ndarray), path
        assert remote.shape == reference.shape, path
        np.testing.assert_allclose(remote, reference, rtol=1e-4, atol=2e-5, err_msg=path)
    elif isinstance(reference, (list, tuple)):
        assert len(remote) == len(reference), path
        for i, (a, b) in enumerate(zip(remote, reference)):
            assert_same(a, b, f"{path}[{i}]")
    elif hasattr(reference, "__dataclass_fields__"):
        assert type(remote) is type(reference), path
        for name in reference.__dataclass_fields__:
            assert_same(getattr(remote, name), getattr(reference, name), f"{path}.{name}")
    elif isinstance(reference, float):
        assert remote == pytest.approx(reference, rel=1e-4, abs=2e-5), path
    else:
        assert remote == reference, path


def test_results_equal_the_in_process_engine(executors, local):
    async def main():
        async with running(executors.settings, executors.address) as registry:
            for label, (model, make) in requests().items():
                remote = await registry.engines[model](make())
                reference = local.engines[model].run_sync(make())
                assert_same(remote, reference, label)

    asyncio.run(main())


def test_a_batch_equals_its_items_one_by_one(executors):
    async def main():
        async with running(executors.settings, executors.address) as registry:
            engine = registry.engines["emb"]
            batched = await engine(EmbedRequest(texts=list(TEXTS)))
            singles = await asyncio.gather(*[engine(EmbedRequest(texts=[t])) for t in TEXTS])
            np.testing.assert_allclose(np.stack([s.vectors[0] for s in singles]), batched.vectors, atol=2e-5)
            scores = await registry.engines["rr"](RerankRequest(query="q", documents=list(TEXTS)))
            alone = [await registry.engines["rr"](RerankRequest(query="q", documents=[d])) for d in TEXTS]
            np.testing.assert_allclose([a.scores[0] for a in alone], scores.scores, atol=2e-5)

    asyncio.run(main())


def test_the_app_serves_a_remote_registry(executors, local):
    """``/v1/models`` shows the executor's backend, dtype and reason; the routes answer as in-process."""
    settings = executors.settings
    with TestClient(create_app(settings, registry=remote_registry(settings, executors.address))) as client:
        cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert cards["emb"]["backend"] == "onnx"
        assert cards["rr"]["backend"] == "torch"
        assert cards["emb"]["dtype"] == "float32"
        assert cards["emb"]["executors"] == ["cpu:0"]
        assert cards["emb"]["backend_reason"] == local.engines["emb"].choice.reason
        assert client.get("/ready").status_code == 200
        answer = client.post("/v1/embeddings", json={"model": "emb", "input": list(TEXTS)})
        assert answer.status_code == 200, answer.text
        vectors = np.array([d["embedding"] for d in answer.json()["data"]], dtype=np.float32)
        np.testing.assert_allclose(vectors, local.engines["emb"].run_sync(EmbedRequest(texts=list(TEXTS))).vectors,
                                   atol=2e-5)
        bad = client.post("/v1/embeddings", json={"model": "emb", "input": ["x"], "dimensions": 10_000})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"


def test_what_does_not_fit_the_arenas_travels_in_the_frame(executors, local, monkeypatch):
    """Arenas of 4 KiB: a request's items and its per-token answer are larger, so both cross as the frame's
    payload, and the answer is the same."""
    from core.executor import client

    monkeypatch.setattr(client, "REQUEST_ARENA_BYTES", 4096)
    monkeypatch.setattr(client, "RESULT_ARENA_BYTES", 4096)

    async def main():
        async with running(executors.settings, executors.address) as registry:
            (link,) = registry.engines["emb"].links
            assert link._requests.size == 4096 and link._results.size == 4096
            make = lambda: EmbedRequest(texts=[LONG[:1500]] * 4, output="tokens")  # noqa: E731
            remote = await registry.engines["emb"](make())
            assert link._allocator.in_use == 0
            assert_same(remote, local.engines["emb"].run_sync(make()), "per-token answer inline")
            small = await registry.engines["emb"](EmbedRequest(texts=["fits"]))
            assert_same(small, local.engines["emb"].run_sync(EmbedRequest(texts=["fits"])), "small answer")

    asyncio.run(main())


def test_the_deadline_travels_to_the_executor(executors):
    """A request whose deadline has passed gets the executor batcher's 504, as in-process."""
    import time

    from core.errors import Timeout

    async def main():
        async with running(executors.settings, executors.address) as registry:
            engine = registry.engines["emb"]
            with pytest.raises(Timeout) as caught:
                await engine(EmbedRequest(texts=list(TEXTS)), deadline=time.monotonic() - 1.0)
            assert caught.value.status == 504 and "deadline" in caught.value.message
            (link,) = engine.links
            assert link.outstanding["emb"] == 0 and link._allocator.in_use == 0
            assert (await engine(EmbedRequest(texts=["still served"]))).vectors.shape == (1, 384)

    asyncio.run(main())


def test_an_answer_that_cannot_be_read_fails_its_request_only(executors, monkeypatch):
    from core.errors import BackendFailure
    from core.executor import wire

    decode = wire.decode_results
    calls = []

    def broken_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("cannot reshape")
        return decode(*args)

    monkeypatch.setattr(wire, "decode_results", broken_once)

    async def main():
        async with running(executors.settings, executors.address) as registry:
            engine = registry.engines["emb"]
            with pytest.raises(BackendFailure, match="executor cpu:0: its answer could not be read"):
                await engine(EmbedRequest(texts=["first"]))
            assert (await engine(EmbedRequest(texts=["second"]))).vectors.shape == (1, 384)
            assert registry.ready

    asyncio.run(main())
