"""300 concurrent clients against a real server whose queue holds 32 items: only 200 or 429 comes back,
every request gets exactly one answer, every 200 carries the vectors of its own input, and /health
keeps answering fast meanwhile."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.tasks.embed import EmbedRequest
from tests.support.server import environ_without_settings, running_server

CLIENTS = 300
PROBE = """
import json, sys, time, httpx
latencies = []
with httpx.Client(base_url=sys.argv[1], timeout=10) as c:
    end = time.monotonic() + 6
    while time.monotonic() < end:
        t = time.perf_counter()
        assert c.get("/health").status_code == 200
        latencies.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
print(json.dumps(latencies))
"""


@pytest.fixture(scope="module")
def overload_server(minilm_onnx_dir):
    env = environ_without_settings()
    env["TESSERA_MODELS"] = json.dumps([{"path": str(minilm_onnx_dir), "name": "m", "max_queue_items": 32,
                                         "max_batch_size": 8}])
    env["TESSERA_RETRY_AFTER_S"] = "2"
    with running_server(env) as base:
        yield base


def test_overload_answers_everyone_correctly(overload_server, minilm_onnx_dir):
    texts = [f"request number {i}: " + "several words to embed " * (1 + i % 7) for i in range(CLIENTS)]
    reference = Engine.load(ModelSpec(path=minilm_onnx_dir), Settings(threads=1)).run_sync(EmbedRequest(texts=texts))
    # /health is probed from another process (its own keep-alive connection), so the load generator's
    # own event loop does not count in the figure
    prober = subprocess.Popen([sys.executable, "-c", PROBE, overload_server], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)

    async def main():
        limits = httpx.Limits(max_connections=CLIENTS + 4)
        async with httpx.AsyncClient(base_url=overload_server, limits=limits, timeout=120) as client:
            async def one(i):
                return i, await client.post("/v1/embeddings", json={"input": texts[i], "model": "m"})

            return await asyncio.gather(*(one(i) for i in range(CLIENTS)))

    results = asyncio.run(main())
    health_ms = json.loads(prober.communicate(timeout=60)[0])
    assert len(results) == CLIENTS and sorted(i for i, _ in results) == list(range(CLIENTS))
    statuses = [r.status_code for _, r in results]
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(429) > 0, "a queue of 32 must refuse some of 300 simultaneous requests"
    assert statuses.count(200) >= 32
    for i, r in results:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "2"
            assert r.json()["error"]["code"] in ("overloaded",)
            continue
        body = r.json()
        assert len(body["data"]) == 1
        got = np.array(body["data"][0]["embedding"], dtype=np.float32)
        np.testing.assert_allclose(got, reference.vectors[i], atol=2e-5)  # its own input, nobody else's
    assert len(health_ms) >= 5
    health_ms.sort()
    p95 = health_ms[int(0.95 * (len(health_ms) - 1))]
    assert p95 < 100, f"/health p95 {p95:.1f} ms under load (all: {health_ms[-5:]})"
