"""Fault injection through a backend wrapper (the real backend underneath), and graceful shutdown of a
real server process."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time

import httpx
import numpy as np

from core.errors import OutOfMemory
from tests.api.conftest import SlowBackend, assert_error, client_for
from tests.support.server import environ_without_settings, free_port, running_process


class OomAbove(SlowBackend):
    """Runs batches of at most ``limit`` items; larger ones raise OutOfMemory, as a GPU would."""

    def __init__(self, inner, limit: int):
        super().__init__(inner, 0)
        self.limit = limit
        self.sizes: list[int] = []

    def run(self, inputs):
        n = inputs["input_ids"].shape[0]
        self.sizes.append(n)
        if n > self.limit:
            raise OutOfMemory(f"cannot fit {n} items")
        return self.inner.run(inputs)


def test_out_of_memory_batch_is_retried_in_halves(minilm_onnx_dir):
    texts = [f"item {i} of a batch that does not fit" for i in range(8)]
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}]) as c:
        expected = np.array([d["embedding"] for d in c.post("/v1/embeddings", json={"input": texts}).json()["data"]])
        engine = c.app.state.registry.engines["m"]
        engine.backend = OomAbove(engine.backend, limit=2)
        r = c.post("/v1/embeddings", json={"input": texts})
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]])
        np.testing.assert_allclose(got, expected, atol=2e-5)
        assert engine.backend.sizes == [8, 4, 2, 2, 4, 2, 2]  # 8 fails → 4 fails → 2 + 2; the other half alike
        assert c.get("/ready").status_code == 200  # recovered: not a failure
        # a single item that does not fit fails alone, in the error shape
        engine.backend.limit = 0
        assert_error(c.post("/v1/embeddings", json={"input": "lonely"}), 500, "out_of_memory")


def test_tokens_per_request_limit(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir)}], max_tokens_per_request=100) as c:
        assert_error(c.post("/v1/embeddings", json={"input": ["word " * 60, "word " * 60]}), 413, "too_many_tokens")
        assert c.post("/v1/embeddings", json={"input": ["word " * 30]}).status_code == 200


def test_inflight_cap_answers_429(minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "m"}], max_inflight_requests=2) as c:
        engine = c.app.state.registry.engines["m"]
        engine.backend = SlowBackend(engine.backend, 0.4)
        results = []

        def call():
            results.append(c.post("/v1/embeddings", json={"input": "slow"}))

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.1)
        assert c.get("/health").status_code == 200  # service routes are not capped
        for t in threads:
            t.join()
        statuses = sorted(r.status_code for r in results)
        assert statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses
        for r in results:
            if r.status_code == 429:
                assert_error(r, 429, "overloaded")


def test_sigterm_drains_in_flight_requests_and_refuses_new_work(minilm_onnx_dir):
    port = free_port()
    env = environ_without_settings()
    env.update(TESSERA_MODELS=json.dumps([{"path": str(minilm_onnx_dir), "name": "m"}]), TESSERA_PORT=str(port),
               TESSERA_SHUTDOWN_GRACE_S="20")
    with running_process([sys.executable, "-m", "core", "serve"], env, port=port, name="sigterm") as (base, proc):
        long_texts = ["a long text that keeps the model busy for a while " * 20] * 96
        results: list = []

        def in_flight():
            results.append(httpx.post(base + "/v1/embeddings", json={"input": long_texts}, timeout=60))

        workers = [threading.Thread(target=in_flight) for _ in range(3)]
        for w in workers:
            w.start()
        time.sleep(0.5)  # the requests are being served
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # new work is refused: the listener is closed (connection refused) or the app answers 503
        try:
            late = httpx.post(base + "/v1/embeddings", json={"input": "too late"}, timeout=10)
            assert late.status_code == 503 and late.json()["error"]["code"] == "not_ready"
        except httpx.ConnectError:
            pass
        for w in workers:
            w.join(60)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert all(len(r.json()["data"]) == 96 for r in results)
        assert proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
