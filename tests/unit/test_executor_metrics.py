"""``core.executor.metrics``: several processes' expositions merged into one (each family once, every sample
labelled ``process``), gathered over real Unix sockets, a process that is not there left out and counted."""

from __future__ import annotations

import asyncio
import re

from prometheus_client.parser import text_string_to_metric_families

from core.batching import BatchStats
from core.metrics import Metrics
from core.executor.metrics import Peers, frontend_socket, merge, serve_exposition


def _values(text: str, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_merge_labels_every_sample_with_its_process_and_keeps_each_family_once():
    front, executor = Metrics(), Metrics()
    front.observe_request("/v1/embeddings", 200, 0.01)
    executor.observe_batch("m", BatchStats(size=3, tokens=30, padded_tokens=32, run_seconds=0.01,
                                           queue_seconds=[0.001] * 3), depth=2)
    text = merge({"frontend-0": front.render().decode(), "executor-cpu:0": executor.render().decode()}, 1).decode()
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types))
    assert _values(text, "tessera_requests_total") == {
        (("process", "frontend-0"), ("route", "/v1/embeddings"), ("status", "200")): 1.0}
    assert _values(text, "tessera_batch_size_sum") == {(("model", "m"), ("process", "executor-cpu:0")): 3.0}
    assert _values(text, "tessera_queue_depth") == {(("model", "m"), ("process", "executor-cpu:0")): 2.0}
    assert _values(text, "tessera_inflight_requests") == {(("process", "executor-cpu:0"),): 0.0,
                                                          (("process", "frontend-0"),): 0.0}
    assert _values(text, "tessera_metrics_missing_processes") == {(): 1.0}


def test_gather_reads_the_other_frontends_and_counts_the_missing(tmp_path, caplog):
    other = Metrics()
    other.observe_request("/v1/embeddings", 200, 0.01)
    other.observe_request("/v1/embeddings", 200, 0.01)
    own = Metrics()
    own.observe_request("/v1/embeddings", 200, 0.01)

    async def scrape() -> str:
        server = await serve_exposition(frontend_socket(tmp_path, 1), other.render)
        try:  # front end 2 and the executor have no socket: left out
            peers = Peers(str(tmp_path), 0, 3, {"cpu:0": str(tmp_path / "cpu-0.sock")}, timeout=5.0)
            return (await peers.gather(own.render())).decode()
        finally:
            server.close()
            await server.wait_closed()

    text = asyncio.run(scrape())
    requests = _values(text, "tessera_requests_total")
    assert {dict(k)["process"]: v for k, v in requests.items()} == {"frontend-0": 1.0, "frontend-1": 2.0}
    assert _values(text, "tessera_metrics_missing_processes") == {(): 2.0}
    assert "metrics: frontend-2 did not answer" in caplog.text
    assert "metrics: executor-cpu:0 did not answer" in caplog.text
