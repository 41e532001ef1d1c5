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
import pytest

from core.errors import OutOfMemory, StartupFailed
from tests.api.conftest import SlowBackend, assert_error, client_for
from tests.support.server import (
    ROOT,
    environ_without_settings,
    free_port,
    inflight_requests,
    running_process,
    wait_for,
)


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


def _refusing(base: str) -> bool:
    """The server refuses new work: /ready answers 503 while it drains, or the listener is closed."""
    try:
        return httpx.get(base + "/ready", timeout=30).status_code == 503
    except httpx.TransportError:
        return True


def test_sigterm_drains_in_flight_requests_and_refuses_new_work(minilm_onnx_dir):
    """Event-driven: SIGTERM is sent once the server counts the three requests in progress, and the late
    request once the server shows it is draining; it passes beside a CPU hog."""
    port = free_port()
    env = environ_without_settings()
    env.update(TESSERA_MODELS=json.dumps([{"path": str(minilm_onnx_dir), "name": "m"}]), TESSERA_PORT=str(port),
               TESSERA_SHUTDOWN_GRACE_S="120", TESSERA_REQUEST_TIMEOUT_S="300")
    with running_process([sys.executable, "-m", "core", "serve"], env, port=port, name="sigterm") as (base, proc):
        long_texts = ["a long text that keeps the model busy for a while " * 20] * 96
        results: list = []

        def in_flight():
            results.append(httpx.post(base + "/v1/embeddings", json={"input": long_texts}, timeout=300))

        workers = [threading.Thread(target=in_flight) for _ in range(3)]
        for w in workers:
            w.start()
        wait_for(lambda: inflight_requests(base) == 3 or len(results) > 0, "three requests in progress")
        assert not results, "a request finished before all three were in progress: make the work longer"
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: _refusing(base), "the server to drain")
        # new work is refused: the listener is closed (connection refused) or the app answers 503
        try:
            late = httpx.post(base + "/v1/embeddings", json={"input": "too late"}, timeout=30)
            assert late.status_code == 503 and late.json()["error"]["code"] == "not_ready"
        except httpx.TransportError:
            pass
        for w in workers:
            w.join(300)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert all(len(r.json()["data"]) == 96 for r in results)
        assert proc.wait(120) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once drained


@pytest.fixture(scope="module")
def model_that_cannot_run(tmp_path_factory, minilm_dir):
    """A tiny BERT with a 100-token vocabulary beside MiniLM's 30,522-token tokenizer: it loads, and every
    forward raises (the tokenizer's ids are past its embeddings), so its warm-up fails as every request
    would. (A T5 saved as ``T5Model`` did this once; T5 folders now load their encoder-only class.)"""
    import shutil

    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("mismatch") / "bert-small-vocab"
    BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         intermediate_size=64)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (minilm_dir / name).exists():
            shutil.copy(minilm_dir / name, folder / name)
    return folder


def test_a_failed_warm_up_is_a_failed_load(model_that_cannot_run, minilm_onnx_dir):
    """It was only logged: /ready answered 200 and every request got 500 backend_failure."""
    broken = {"path": str(model_that_cannot_run), "name": "broken", "backend": "torch"}
    with pytest.raises(StartupFailed, match="warm-up"):
        with client_for(models=[broken]):
            pass
    # allow_degraded: the others serve; the model is reported failed, never ready, and answers 503
    with client_for(models=[broken, {"path": str(minilm_onnx_dir), "name": "m"}], allow_degraded=True) as c:
        assert "failed to load" in c.get("/ready").json()["models"]["broken"]
        assert_error(c.post("/v1/embeddings", json={"model": "broken", "input": "x"}), 503, "not_ready")
        assert c.post("/v1/embeddings", json={"model": "m", "input": "x"}).status_code == 200
    # alone and degraded allowed, nothing is served: start-up fails
    with pytest.raises(StartupFailed):
        with client_for(models=[broken], allow_degraded=True):
            pass


def test_a_failed_warm_up_fails_the_server_start(model_that_cannot_run):
    """``python -m core serve`` exits with status 1 naming the warm-up, rather than serving a model that
    cannot answer."""
    import subprocess

    env = environ_without_settings()
    env.update(TESSERA_MODELS=json.dumps([{"path": str(model_that_cannot_run), "name": "broken",
                                           "backend": "torch"}]), TESSERA_PORT=str(free_port()),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "core", "serve"], env=env, capture_output=True, text=True,
                          timeout=180, cwd=ROOT)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "warm-up batch" in done.stderr and "broken" in done.stderr


def test_registry_warm_up_moves_a_failing_model_to_failed(model_that_cannot_run):
    """Lambda's before-snapshot warm-up: a model that fails it is recorded as failed, not kept serving."""
    from core.config import Settings
    from core.engine import Registry

    settings = Settings(models=[{"path": str(model_that_cannot_run), "name": "broken", "backend": "torch"}],
                        threads=1)
    registry = Registry.from_settings(settings, warm_up=False)
    assert list(registry.engines) == ["broken"]
    registry.warm_up()
    assert not registry.engines and "warm-up" in registry.failed["broken"].error
    with pytest.raises(StartupFailed):
        registry.raise_if_unusable()
