"""``/metrics`` of a server with two front ends and an executor, as real processes: every scrape, whichever
front end answers it, shows both front ends' request counters and the executor's batch metrics, each sample
labelled with its process; a process that does not answer is left out and counted, never a 5xx."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.scaleout.conftest import frontend_of, supervised_server


@pytest.fixture(scope="module")
def one_model(near_free_dir):
    return [{"path": str(near_free_dir), "name": "nf", "backend": "torch"}]


def _samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _scrape(base: str) -> tuple[int, str]:
    with httpx.Client(base_url=base, timeout=60) as client:  # a new connection: the kernel picks the front end
        resp = client.get("/metrics")
    assert resp.status_code == 200, resp.text
    return frontend_of(resp), resp.text


def test_every_scrape_answers_for_every_process(one_model):
    with supervised_server(one_model, 2, name="metrics") as server:
        (device,) = server.executor_pids()
        executor = f"executor-{device}"
        # the items the executor batched before any request: each front end's start-up warm pass
        warm = sum(s.value for s in _samples(_scrape(server.base)[1]) if s.name == "tessera_batch_size_sum"
                   and s.labels == {"model": "nf", "process": executor})
        served: Counter = Counter()
        sent = 0
        while sent < 20 or len(served) < 2:  # new connections until both front ends answered some
            assert sent < 400, f"only front ends {sorted(served)} answered"
            with httpx.Client(base_url=server.base, timeout=60) as client:
                resp = client.post("/v1/embeddings", json={"model": "nf", "input": f"text {sent}"})
            assert resp.status_code == 200, resp.text
            served[frontend_of(resp)] += 1
            sent += 1
        scraped_by = set()
        for _ in range(40):
            index, text = _scrape(server.base)
            scraped_by.add(index)
            types = re.findall(r"^# TYPE (\S+) ", text, re.M)
            assert len(types) == len(set(types)), "a family appears more than once"
            samples = _samples(text)
            assert all("process" in s.labels for s in samples if s.name != "tessera_metrics_missing_processes")
            requests = {s.labels["process"]: s.value for s in samples if s.name == "tessera_requests_total"
                        and s.labels["route"] == "/v1/embeddings" and s.labels["status"] == "200"}
            assert requests == {f"frontend-{i}": float(n) for i, n in served.items()}, text
            assert sum(requests.values()) == sent
            batched = {s.labels["process"]: s.value for s in samples
                       if s.name == "tessera_batch_size_sum" and s.labels["model"] == "nf" and s.value}
            # every item was batched in the executor (one per request)
            assert list(batched) == [executor] and batched[executor] == warm + sent, text
            assert any(s.name == "tessera_batch_size_count" and s.labels["process"] == executor
                       and s.value > 0 for s in samples)
            assert any(s.name == "tessera_queue_depth" and s.labels == {"model": "nf", "process": executor}
                       for s in samples)
            assert [s.value for s in samples if s.name == "tessera_metrics_missing_processes"] == [0.0]
            if scraped_by == {0, 1} and _ >= 5:
                break
        assert scraped_by == {0, 1}, "every scrape landed on one front end"

        # an executor that cannot answer (stopped) is left out of the scrape and counted; the scrape answers 200
        pid = server.executor_pids()[device]
        os.kill(pid, signal.SIGSTOP)
        try:
            _, text = _scrape(server.base)
        finally:
            os.kill(pid, signal.SIGCONT)
        samples = _samples(text)
        assert [s.value for s in samples if s.name == "tessera_metrics_missing_processes"] == [1.0]
        assert {s.labels["process"] for s in samples if s.name == "tessera_requests_total"} == {
            "frontend-0", "frontend-1"}
        assert not any(s.labels.get("process") == executor for s in samples)
        assert f"metrics: {executor} did not answer" in server.log()
