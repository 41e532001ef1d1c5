"""Several front-end processes × hundreds of concurrent mixed requests on executors shared by them: every
answer is its own input's (0 crossed, 0 lost), with cancellations and 429s in the mix; a model on two CPU
executors (``cpu:0,cpu:1``) has work balanced onto both."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from core.engine import Registry
from core.executor import ExecutorSet
from core.tasks.embed import EmbedRequest
from core.tasks.rerank import RerankRequest
from tests.executor import clients
from tests.executor.conftest import segments, settings_for
from tests.support.sentences import SENTENCES

TEXTS = [s[: 40 + 7 * i] for i, s in enumerate(list(SENTENCES)[:24])]
QUERY = "which sentence talks about cats"


@pytest.fixture(scope="module")
def specs(minilm_onnx_dir, reranker_dir):
    return [{"path": minilm_onnx_dir, "name": "emb", "backend": "onnx", "max_queue_items": 128},
            {"path": reranker_dir, "name": "rr", "backend": "torch"}]


@pytest.fixture(scope="module")
def references(specs):
    local = Registry.from_settings(settings_for(*[{**s, "device": "cpu"} for s in specs]))
    emb, rr = local.engines["emb"], local.engines["rr"]
    return {
        "vectors": np.stack([emb.run_sync(EmbedRequest(texts=[t])).vectors[0] for t in TEXTS]),
        "tokens": [emb.run_sync(EmbedRequest(texts=[t], output="tokens")).vectors[0] for t in TEXTS],
        "scores": np.array([rr.run_sync(RerankRequest(query=QUERY, documents=[t])).scores[0] for t in TEXTS]),
        "query": QUERY,
    }


def test_front_ends_share_the_executors_without_crossing_answers(specs, references):
    settings = settings_for({**specs[0], "device": "cpu:0,cpu:1"}, {**specs[1], "device": "cpu:1"})
    executors = ExecutorSet.start(settings)
    try:
        pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
        with pool:
            runs = [pool.submit(clients.load_client, settings, executors.address, TEXTS, references, seed, 300, 48)
                    for seed in (1, 2)]
            results = [run.result(timeout=300) for run in runs]
        assert executors.check() is None
    finally:
        executors.stop(timeout=10.0)
    for counts in results:
        assert counts["errors"] == []
        assert counts["crossed"] == 0
        assert counts["lost"] == 0
        assert counts["ok"] + counts["overloaded"] + counts["cancelled"] == 300
        assert counts["ok"] > 30, counts
    assert sum(c["overloaded"] for c in results) > 0, "no 429 in the mix: max_queue_items was never reached"
    assert sum(c["cancelled"] for c in results) > 0
    # both executors of emb received work from each front end; rr lives on cpu:1 only
    for counts in results:
        assert counts["sent"]["cpu:0"].get("emb", 0) > 20 and counts["sent"]["cpu:1"].get("emb", 0) > 20
        assert "rr" not in counts["sent"]["cpu:0"]
    assert segments(executors.shm_prefix) == []
