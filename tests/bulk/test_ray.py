"""``python -m core embed --on ray``: the job on a real local Ray cluster (2 CPUs, 2 actors)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from core.bulk.job import JobOptions, run_local
from core.config import Settings
from tests.bulk.conftest import corpus, write_jsonl
from tests.bulk.test_embed_job import embed_command, job_env, read
from tests.support.server import ROOT

ray = pytest.importorskip("ray", reason="the [ray] extra (scripts/bootstrap installs it)")


def test_a_ray_job_writes_what_the_local_job_writes_and_resumes_a_killed_one(tmp_path, job_model):
    import asyncio

    from core.bulk.ray_runner import run_ray

    texts = corpus(900, repeats=90, seed=5)
    ids = [f"r{i}" for i in range(len(texts))]
    source = write_jsonl(tmp_path / "c.jsonl", texts, ids)
    settings = Settings(models=[job_model], threads=1)
    local = tmp_path / "local.parquet"
    asyncio.run(run_local(settings, JobOptions(input=str(source), output=str(local), id_column="doc_id",
                                               rows_per_part=100)))

    # a local job killed after two parts, then finished on Ray: the same work folder, every id once
    out = tmp_path / "ray.parquet"
    proc = subprocess.Popen(embed_command(source, out, job_model, "--id-column", "doc_id", "--rows-per-part", "100"),
                            cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = tmp_path / "ray.parquet.parts"
    deadline = time.monotonic() + 240
    while len(list(parts.glob("part-*.parquet"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    summary = run_ray(settings, JobOptions(input=str(source), output=str(out), id_column="doc_id", rows_per_part=100),
                      actors=2, num_cpus=2)
    assert not ray.is_initialized()  # the job's own Ray was stopped
    assert summary.resumed_from >= 200 and summary.rows == len(texts)
    assert summary.rows_this_run == len(texts) - summary.resumed_from
    table, vectors = read(out)
    assert table.column("doc_id").to_pylist() == ids
    np.testing.assert_allclose(vectors, read(local)[1], atol=2e-5)
    meta = json.loads(table.schema.metadata[b"tessera"])
    local_meta = json.loads(pq.read_schema(local).metadata[b"tessera"])
    assert meta["model"]["identity"] == local_meta["model"]["identity"] and meta["job"] == local_meta["job"]


def test_the_command_line_runs_on_ray(tmp_path, job_model):
    texts = corpus(120, seed=9)
    source = write_jsonl(tmp_path / "c.jsonl", texts)
    out = tmp_path / "o.parquet"
    done = subprocess.run(embed_command(source, out, job_model, "--on", "ray", "--actors", "1", "--rows-per-part",
                                        "50"), cwd=ROOT, env={**job_env(), "TESSERA_THREADS": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows: 120 (120 this run, 0 done before)" in done.stdout
    assert pq.read_table(out).column("id").to_pylist() == list(range(120))


def test_ray_actors_share_a_redis_embedding_cache(tmp_path, job_model):
    """With ``embedding_cache`` a Redis URL, the actors read what another job stored there: a corpus embedded
    once (here, by a local job) costs a Ray job no model work, and its vectors are the stored ones; a server
    on the same Redis answers those texts from it too."""
    import asyncio

    from core.bulk.ray_runner import run_ray
    from tests.support.redis_server import redis_server

    texts = corpus(300, repeats=30, seed=13)
    source = write_jsonl(tmp_path / "c.jsonl", texts)
    with redis_server() as redis:
        settings = Settings(models=[job_model], threads=1, embedding_cache=redis.url)
        first = asyncio.run(run_local(settings, JobOptions(input=str(source), output=str(tmp_path / "a.parquet"),
                                                           rows_per_part=50)))
        assert first.computed == len(set(texts)) and redis.keys() == len(set(texts))
        second = run_ray(settings, JobOptions(input=str(source), output=str(tmp_path / "b.parquet"), rows_per_part=50),
                         actors=2, num_cpus=2)
        # the server keys its cache as the job does: the job's work answers its requests too
        from fastapi.testclient import TestClient

        from core.api.app import create_app

        with TestClient(create_app(settings)) as client:
            answer = client.post("/v1/embeddings", json={"input": texts[:5]})
            assert answer.status_code == 200
            hits = [line for line in client.get("/metrics").text.splitlines()
                    if line.startswith("tessera_embedding_cache_hits_total{")]
        assert hits and float(hits[0].rsplit(" ", 1)[1]) == 5
    assert second.computed == 0 and second.repeated == len(texts)
    assert read(tmp_path / "b.parquet")[1].tobytes() == read(tmp_path / "a.parquet")[1].tobytes()


class _Probe:
    """A map_batches actor reporting what Ray gave it and the settings EmbedActor would run with."""

    def __init__(self, settings) -> None:
        import os

        from core.bulk.ray_runner import actor_settings

        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.devices = [m.device for m in actor_settings(settings, ray.get_gpu_ids()).model_specs()]

    def __call__(self, batch: dict) -> dict:
        n = len(batch["start"])
        return {"start": batch["start"], "gpus": np.array([",".join(self.gpu_ids)] * n),
                "visible": np.array([self.visible] * n), "devices": np.array([",".join(self.devices)] * n)}


@pytest.mark.parametrize("declared_gpus", [0, 1])
def test_the_actor_pool_asks_ray_for_gpus_where_the_cluster_has_them(job_model, declared_gpus):
    """The pool's request is built from a real local cluster's ``ray.cluster_resources()``, and Ray schedules
    the actors with it. The GPU is one Ray is told of (``num_gpus=1``: Ray's resource accounting, no CUDA
    here), so this checks the scheduling decision and the device the actor picks, not a model run on a GPU."""
    from core.bulk.ray_runner import actor_request

    settings = Settings(models=[job_model], threads=2)
    ray.init(num_cpus=2, num_gpus=declared_gpus, include_dashboard=False, log_to_driver=False)
    try:
        resources = ray.cluster_resources()
        assert resources.get("GPU", 0) == declared_gpus
        request = actor_request(resources, settings.threads, actors=None, parts=6)
        if declared_gpus:
            assert request == {"concurrency": 1, "num_gpus": 1, "num_cpus": 0}
            # asked for more actors than GPUs: one per GPU (more would wait for a GPU forever)
            assert actor_request(resources, 2, actors=3, parts=6)["concurrency"] == 1
        else:
            assert request == {"concurrency": 1, "num_gpus": 0, "num_cpus": 2}
            assert actor_request(resources, 1, actors=None, parts=6)["concurrency"] == 2
        rows = ray.data.from_items([{"start": i} for i in range(6)]).map_batches(
            _Probe, fn_constructor_args=(settings,), batch_size=1, **request).take_all()
        assert sorted(int(r["start"]) for r in rows) == list(range(6))
        if declared_gpus:
            assert {r["gpus"] for r in rows} == {"0"} and {r["visible"] for r in rows} == {"0"}
            assert {r["devices"] for r in rows} == {"cuda"}
        else:
            assert {r["gpus"] for r in rows} == {""}
            assert {r["devices"] for r in rows} == {str(settings.model_specs()[0].device)}
    finally:
        ray.shutdown()
