"""A server with two front ends, as real processes on loopback: mixed concurrent traffic answered correctly by
both, a killed front end restarted while the other serves, SIGTERM drains every front end and exits 0, SIGKILL
of the supervisor leaves no process behind, a front end that cannot start stops the server with a clear line."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import shutil
import signal
import socket
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.supervisor import SPREADS_CONNECTIONS
from tests.scaleout.conftest import (children_of, frontend_of, group_members, proc_stat, supervised_server,
                                     wait_gone)
from tests.support.server import free_port, socket_inodes, wait_for

REQUESTS = 1000
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


@pytest.fixture(scope="module")
def mixed_models(near_free_dir, reranker_dir, classifier_dir):
    return [
        {"path": str(near_free_dir), "name": "nf", "backend": "torch"},
        # the same folder behind a queue of 8 items: bursts of it are refused with 429
        {"path": str(near_free_dir), "name": "nfq", "backend": "torch", "max_queue_items": 8, "max_batch_size": 4},
        {"path": str(reranker_dir), "name": "rr", "backend": "torch"},
        {"path": str(classifier_dir), "name": "cls", "backend": "torch"},
    ]


def _text(rng: random.Random, i: int, j: int) -> str:
    return f"request {i} item {j}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))


def _requests(seed: int = 7) -> list[dict]:
    """REQUESTS requests of four kinds, each with inputs of its own (so a crossed answer cannot match)."""
    rng = random.Random(seed)
    out = []
    for i in range(REQUESTS):
        kind = ("embed", "embed", "queued", "rerank", "classify")[i % 5]
        texts = [_text(rng, i, j) for j in range(rng.randint(1, 6))]
        cancel = i % 23 == 0  # the client gives up almost at once and drops the connection
        if kind in ("embed", "queued"):
            fmt = "base64" if i % 2 else "float"
            body = {"model": "nf" if kind == "embed" else "nfq", "input": texts, "encoding_format": fmt}
            out.append({"i": i, "kind": kind, "path": "/v1/embeddings", "body": body, "texts": texts, "cancel": cancel})
        elif kind == "rerank":
            body = {"model": "rr", "query": f"query {i}", "documents": texts}
            out.append({"i": i, "kind": kind, "path": "/v1/rerank", "body": body, "texts": texts, "cancel": cancel})
        else:
            body = {"model": "cls", "input": texts}
            out.append({"i": i, "kind": kind, "path": "/v1/classify", "body": body, "texts": texts, "cancel": cancel})
    return out


async def _references(models: list[dict], requests: list[dict]) -> dict:
    """Every request's expected answer, computed in this process through the same models, one input at a time."""
    from core.config import Settings
    from core.inprocess import AsyncModels

    refs: dict = {}
    async with AsyncModels(Settings(models=models[:1] + models[2:])) as api:
        for r in requests:
            if r["kind"] in ("embed", "queued"):
                refs[r["i"]] = np.vstack([await api.embed([t], "nf") for t in r["texts"]])
            elif r["kind"] == "rerank":
                refs[r["i"]] = np.array([(await api.rerank(r["body"]["query"], [t], "rr"))[0] for t in r["texts"]])
            else:
                rows = []
                for t in r["texts"]:
                    labels, scores = await api.classify([t], "cls")
                    rows.append(dict(zip(labels, scores[0].tolist())))
                refs[r["i"]] = rows
    return refs


def _vectors(data: list[dict], fmt: str) -> np.ndarray:
    if fmt == "base64":
        return np.vstack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def _check(r: dict, answer: dict, ref) -> None:
    """``answer`` is the answer to ``r``'s own inputs (raises AssertionError naming the request otherwise)."""
    if r["kind"] in ("embed", "queued"):
        data = sorted(answer["data"], key=lambda d: d["index"])
        got = _vectors(data, r["body"]["encoding_format"])
        assert got.shape == ref.shape and np.allclose(got, ref, atol=2e-4), f"request {r['i']}: crossed vectors"
    elif r["kind"] == "rerank":
        got = np.zeros(len(r["texts"]))
        for res in answer["results"]:
            got[res["index"]] = res["relevance_score"]
        assert np.allclose(got, ref, atol=2e-4), f"request {r['i']}: crossed scores {got} != {ref}"
    else:
        assert len(answer["data"]) == len(ref), f"request {r['i']}: {len(answer['data'])} answers"
        for row, expected in zip(answer["data"], ref):
            got = {ls["label"]: ls["score"] for ls in row}
            assert got.keys() == expected.keys()
            assert all(abs(got[k] - expected[k]) < 2e-4 for k in got), f"request {r['i']}: crossed labels"


async def _send_all(base: str, requests: list[dict]) -> list[tuple[dict, str, httpx.Response | None]]:
    # a new connection per request: the kernel spreads them over the front ends, and no request is sent on a
    # kept-alive connection the server is closing for idleness (uvicorn's 5 s; a loaded machine starves this
    # client's loop that long), which httpx reports as a ReadError without a retry
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=180) as client:
        async def one(r):
            timeout = 0.002 + (r["i"] % 5) * 0.01 if r["cancel"] else 180
            try:
                resp = await client.post(r["path"], json=r["body"], timeout=timeout)
            except httpx.TimeoutException:
                return r, "cancelled", None
            return r, "answered", resp

        return await asyncio.gather(*(one(r) for r in requests))


def test_1000_mixed_requests_across_two_frontends(mixed_models):
    requests = _requests()
    refs = asyncio.run(_references(mixed_models, requests))
    env = {"TESSERA_MAX_INFLIGHT_REQUESTS": "4096"}
    with supervised_server(mixed_models, 2, env, name="mixed") as server:
        outcomes = asyncio.run(_send_all(server.base, requests))
        counts = {"ok": 0, "429": 0, "cancelled": 0}
        frontends = set()
        for r, what, resp in outcomes:
            if what == "cancelled":
                assert r["cancel"], f"request {r['i']} ({r['kind']}) got no answer: lost"
                counts["cancelled"] += 1
                continue
            frontends.add(frontend_of(resp))
            if resp.status_code == 429:
                assert r["kind"] == "queued", f"request {r['i']} ({r['kind']}): 429 {resp.text}"
                error = resp.json()["error"]
                assert error["code"] and error["message"] and "retry-after" in resp.headers
                counts["429"] += 1
                continue
            assert resp.status_code == 200, f"request {r['i']} ({r['kind']}): {resp.status_code} {resp.text}"
            _check(r, resp.json(), refs[r["i"]])
            counts["ok"] += 1
        assert sum(counts.values()) == REQUESTS
        assert frontends == {0, 1}, f"answered only by front end(s) {frontends}"
        assert counts["429"] > 0, counts  # the small queue refused some
        assert counts["ok"] > REQUESTS * 0.6, counts
        # the server still answers everything after the cancellations and refusals
        for r in requests[:40]:
            if r["kind"] != "queued":
                resp = httpx.post(server.base + r["path"], json=r["body"], timeout=60)
                assert resp.status_code == 200, resp.text
                _check(r, resp.json(), refs[r["i"]])


@pytest.fixture(scope="module")
def one_model(near_free_dir):
    return [{"path": str(near_free_dir), "name": "nf", "backend": "torch"}]


def _frontends_answering(base: str, want: set[int], tries: int = 400) -> set[int]:
    """New connections until every front end of ``want`` answered /v1/embeddings (bounded)."""
    seen: set[int] = set()
    for i in range(tries):
        with httpx.Client(base_url=base, timeout=60) as client:  # a new connection each: the kernel picks
            resp = client.post("/v1/embeddings", json={"model": "nf", "input": f"probe {i}"})
        assert resp.status_code == 200, resp.text
        seen.add(frontend_of(resp))
        if want <= seen:
            break
    return seen


def test_a_killed_frontend_is_restarted_while_the_other_serves(one_model):
    with supervised_server(one_model, 2, name="kill-frontend") as server:
        before = server.frontend_pids()
        assert sorted(before) == [0, 1] and set(before.values()) <= set(children_of(server.proc.pid))
        os.kill(before[1], signal.SIGKILL)
        wait_for(lambda: proc_stat(before[1]) is None or proc_stat(before[1])[0] == "Z", "the front end to die")
        for i in range(30):  # meanwhile the other front end answers every request
            resp = httpx.post(server.base + "/v1/embeddings", json={"model": "nf", "input": f"while {i}"}, timeout=60)
            assert resp.status_code == 200, resp.text
        wait_for(lambda: server.frontend_pids().get(1, before[1]) != before[1], "front end 1 serving again", 300)
        assert "front end 1 (pid %d) exited with signal SIGKILL; starting it again" % before[1] in server.log()
        after = server.frontend_pids()
        assert after[0] == before[0] and set(after.values()) <= set(children_of(server.proc.pid))
        assert before[1] not in children_of(server.proc.pid)
        assert _frontends_answering(server.base, {0, 1}) == {0, 1}
        assert httpx.get(server.base + "/v1/models", timeout=30).json()["frontends"] == {
            "count": 2, "reason": "frontends=2 was set: 2 front-end processes"}



def _connections_frontends(port: int, count: int) -> list[int]:
    """``count`` connections to 127.0.0.1:``port`` opened together, as a client pool opens them, each asking once
    (``POST /v1/embeddings``) which front end holds it: one answer per connection. Counted per connection, not per
    request: a pool reuses its connections unevenly, so its requests' split scatters wider than the kernel's
    (in 40 pools of 64 aiohttp requests the smaller share went down to 13, in 60 pools of 64 connections to 22)."""

    async def one(i: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            body = json.dumps({"model": "nf", "input": f"which {i}"}).encode()
            writer.write(b"POST /v1/embeddings HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            assert head[0].startswith("HTTP/1.1 200"), head
            return int(next(line.split(":", 1)[1] for line in head if line.lower().startswith("x-tessera-frontend:")))
        finally:
            writer.close()
            await writer.wait_closed()

    async def run() -> list[int]:
        return list(await asyncio.gather(*(one(i) for i in range(count))))

    return asyncio.run(run())


def _listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on 127.0.0.1:``port`` (``/proc/net/tcp``: state 0A)."""
    found = set()
    with open("/proc/net/tcp") as table:
        for row in list(table)[1:]:
            fields = row.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def test_each_front_end_listens_on_a_socket_of_its_own(one_model):
    """Connections are spread by the kernel, not by a race: on one shared listening socket the front end whose
    loop woke first took most of a pool's connections (of 64: 62, 60, 58, 55, 47, 44, 40 in seven pools of the
    benchmarks' load generator), and the other sat idle for as long as they lived. Each front end now listens
    on its own socket of a SO_REUSEPORT group, one per front end, a restarted one too (the dead one's socket is
    closed, so that new connections go to the front end that serves), and a pool's connections reach both."""
    if not SPREADS_CONNECTIONS:
        pytest.skip("the kernel spreads a SO_REUSEPORT group's connections on Linux only")
    with supervised_server(one_model, 2, name="spread") as server:
        port = int(server.base.rsplit(":", 1)[1])

        def one_socket_each() -> None:
            listening = _listening_sockets(port)
            held = {i: socket_inodes(pid) & listening for i, pid in server.frontend_pids().items()}
            assert len(listening) == 2 and all(len(h) == 1 for h in held.values()) and held[0] != held[1], (
                listening, held)

        one_socket_each()
        for _ in range(2):  # a pool's connections, opened together, reach both
            held_by = _connections_frontends(port, 64)
            assert min(held_by.count(0), held_by.count(1)) >= 12, held_by
        before = server.frontend_pids()
        os.kill(before[1], signal.SIGKILL)
        wait_for(lambda: server.frontend_pids().get(1, before[1]) != before[1], "front end 1 serving again", 300)
        wait_for(lambda: len(_listening_sockets(port)) == 2, "one listening socket per front end again", 60)
        one_socket_each()
        assert _frontends_answering(server.base, {0, 1}) == {0, 1}

def test_sigterm_drains_every_frontend_and_exits_0(one_model):
    long_texts = [" ".join(WORDS * 12) + f" {i}" for i in range(300)]
    env = {"TESSERA_SHUTDOWN_GRACE_S": "120", "TESSERA_REQUEST_TIMEOUT_S": "300"}
    with supervised_server(one_model, 2, env, name="sigterm") as server:
        # SIGTERM once the work is in the front ends: one scrape shows every process's in-flight gauge
        answers = _heavy_load(server, long_texts, 12, 6, lambda: os.kill(server.proc.pid, signal.SIGTERM))
        assert server.proc.wait(180) == 0, server.log()[-3000:]
        ok = [a for a in answers if isinstance(a, httpx.Response) and a.status_code == 200]
        # what was in flight finished; what came after SIGTERM was refused in the error shape or not accepted
        assert len(ok) >= 6, [a if not isinstance(a, httpx.Response) else a.status_code for a in answers]
        for a in answers:
            if isinstance(a, httpx.Response):
                if a.status_code == 200:
                    assert len(a.json()["data"]) == len(long_texts)
                else:
                    assert a.status_code == 503 and a.json()["error"]["message"], a.text
        wait_gone(server.pgid)
        assert "SIGTERM: draining 2 front ends" in server.log()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", int(server.base.rsplit(":", 1)[1])), timeout=5).close()


def test_sigkill_of_the_supervisor_leaves_no_process(one_model):
    with supervised_server(one_model, 2, name="sigkill") as server:
        members = set(group_members(server.pgid))
        children = {server.proc.pid, *server.frontend_pids().values(), *server.executor_pids().values()}
        assert len(children) == 4 and children <= members, (children, members)  # supervisor, executor, 2 front ends
        # traffic first, so that the front ends and the executor share memory segments
        for i in range(20):
            resp = httpx.post(server.base + "/v1/embeddings", json={"model": "nf", "input": [f"t {i}"] * 8}, timeout=60)
            assert resp.status_code == 200, resp.text
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(30)
        wait_gone(server.pgid)  # every child dies with it (PR_SET_PDEATHSIG), none left serving the port
        left = [p.name for p in Path("/dev/shm").glob(f"tessera-{server.proc.pid}-*")]
        assert not left, f"shared-memory segments left behind: {left}"


def test_a_model_that_cannot_load_stops_the_server_before_any_frontend(tmp_path):
    models = [{"path": str(tmp_path / "missing"), "name": "gone", "backend": "torch"}]
    with supervised_server(models, 2, name="bad-model", wait=False) as server:
        assert server.proc.wait(300) == 1
        log = server.log()
        assert "executors failed to start: model 'gone' failed to load on cpu:0" in log, log
        assert "front end 0 started" not in log
        wait_gone(server.pgid)


def test_a_frontend_that_cannot_start_stops_the_server(one_model, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("a-key\n")
    env = {"TESSERA_API_KEYS_FILE": str(keys)}  # read as the settings are parsed: by the server, then by each front end
    with supervised_server(one_model, 2, env, name="bad-start", wait=False) as server:
        # gone once the server has started (its executor loads the model, before any front end): the front ends fail
        wait_for(lambda: "model nf: backend" in server.log(), "the executor loading the model", 300)
        keys.unlink()
        assert server.proc.wait(300) == 1
        log = server.log()
        assert "before it served" in log and "stopping the server: a front end failed to start" in log, log
        wait_gone(server.pgid)


def test_a_taken_port_is_refused_before_any_frontend(one_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with supervised_server(one_model, 2, {"TESSERA_PORT": str(port)}, name="taken", wait=False) as server:
            assert server.proc.wait(120) == 1
            assert f"cannot listen on 127.0.0.1:{port}" in server.log()
            assert "front end 0 started" not in server.log()


def _heavy_load(server, texts: list[str], requests: int, in_flight: int, then) -> list:
    """``requests`` concurrent /v1/embeddings of ``texts``; once ``in_flight`` of them are in the front ends
    (the in-flight gauges of every process in one /metrics, added up) call ``then()``; every outcome."""
    async def load():
        async with httpx.AsyncClient(base_url=server.base, limits=httpx.Limits(max_connections=64),
                                     timeout=300) as client:
            tasks = [asyncio.create_task(client.post("/v1/embeddings", json={"model": "nf", "input": texts}))
                     for _ in range(requests)]
            inflight = 0.0
            for _ in range(3000):
                async with httpx.AsyncClient(base_url=server.base, timeout=60) as probe:
                    resp = await probe.get("/metrics")
                inflight = sum(s.value for f in text_string_to_metric_families(resp.text) for s in f.samples
                               if s.name == "tessera_inflight_requests")
                if inflight >= in_flight:
                    break
                await asyncio.sleep(0.02)
            assert inflight >= in_flight, inflight
            then()
            return await asyncio.gather(*tasks, return_exceptions=True)

    return asyncio.run(load())


def test_a_killed_executor_fails_its_requests_then_is_restarted(one_model):
    texts = [" ".join(WORDS * 12) + f" {i}" for i in range(300)]
    with supervised_server(one_model, 2, {"TESSERA_REQUEST_TIMEOUT_S": "300"}, name="kill-executor") as server:
        executor = server.executor_pids()["cpu:0"]
        answers = _heavy_load(server, texts, 12, 4, lambda: os.kill(executor, signal.SIGKILL))
        failed = [a for a in answers if isinstance(a, httpx.Response) and a.status_code >= 500]
        assert failed, [getattr(a, "status_code", a) for a in answers]
        for a in answers:  # each either finished before the kill or failed clearly, in the error shape
            assert isinstance(a, httpx.Response), a
            if a.status_code != 200:
                assert a.status_code in (500, 503), a.text
                assert "executor cpu:0" in a.json()["error"]["message"], a.text
        # each front end answers /ready 200 again once its link reached the restarted executor (each reconnects
        # on its own: one may be back a moment before the other, so wait for both)
        ready = set()

        def both_ready() -> bool:
            resp = httpx.get(server.base + "/ready", timeout=30)
            if resp.status_code == 200:
                ready.add(frontend_of(resp))
            return ready == {0, 1}

        wait_for(both_ready, "/ready 200 again from both front ends", 300)
        assert f"executor cpu:0 (pid {executor}) exited with signal 9" in server.log()
        assert server.executor_pids()["cpu:0"] != executor and "executors restarted: cpu:0" in server.log()
        seen = set()
        for i in range(200):  # both front ends reach the new executor
            with httpx.Client(base_url=server.base, timeout=60) as client:
                resp = client.post("/v1/embeddings", json={"model": "nf", "input": f"after {i}"})
            assert resp.status_code == 200, resp.text
            seen.add(frontend_of(resp))
            if seen == {0, 1}:
                break
        assert seen == {0, 1}


def test_an_executor_that_cannot_restart_stops_the_server(near_free_dir, tmp_path):
    folder = shutil.copytree(near_free_dir, tmp_path / "model")
    models = [{"path": str(folder), "name": "nf", "backend": "torch"}]
    with supervised_server(models, 2, name="executor-gone") as server:
        shutil.rmtree(folder)  # its restart cannot load the model again
        os.kill(server.executor_pids()["cpu:0"], signal.SIGKILL)
        assert server.proc.wait(300) == 1
        log = server.log()
        assert "executor restart 3 of 3 failed" in log and "stopping the server: executors could not be restarted" in log
        wait_gone(server.pgid)


def test_weights_are_loaded_once_per_device(minilm_dir):
    """MiniLM (~90 MB of fp32 weights) on torch: the executor holds them, the two front ends do not."""
    from benchmarks.server import rss_mb

    weights_mb = (minilm_dir / "model.safetensors").stat().st_size / 2**20
    models = [{"path": str(minilm_dir), "name": "minilm", "backend": "torch"}]
    with supervised_server(models, 2, name="rss") as server:
        for i in range(40):
            resp = httpx.post(server.base + "/v1/embeddings", json={"model": "minilm", "input": [f"x {i}"] * 4},
                              timeout=60)
            assert resp.status_code == 200, resp.text
        executor = rss_mb(server.executor_pids()["cpu:0"])
        frontends = [rss_mb(pid) for pid in server.frontend_pids().values()]
        print(f"RSS: executor {executor:.0f} MB, front ends {', '.join(f'{f:.0f}' for f in frontends)} MB; "
              f"weights {weights_mb:.0f} MB")
        for frontend in frontends:
            assert executor - frontend > 0.8 * weights_mb, (executor, frontends, weights_mb)


def test_sagemaker_serve_with_two_frontends(one_model):
    """SageMaker's ``serve`` (run from /, as the images do): the same layout; ``/ping`` and ``/invocations``
    answered by both front ends, ``/ping`` 503 while the executor is down."""
    from tests.support.server import ROOT

    port = free_port()
    command = [sys.executable, str(ROOT / "adapters" / "sagemaker" / "serve")]
    env = {"SAGEMAKER_BIND_TO_PORT": str(port), "TESSERA_PORT": str(port)}
    with supervised_server(one_model, 2, env, name="sagemaker", command=command, cwd=Path("/")) as server:
        seen = set()
        for i in range(200):
            with httpx.Client(base_url=server.base, timeout=60) as client:
                ping = client.get("/ping")
                resp = client.post("/invocations", json={"input": [f"doc {i}", "other"]})
            assert ping.status_code == 200 and resp.status_code == 200, (ping.text, resp.text)
            assert len(resp.json()["data"]) == 2
            seen |= {frontend_of(ping), frontend_of(resp)}
            if seen == {0, 1}:
                break
        assert seen == {0, 1}
        os.kill(server.executor_pids()["cpu:0"], signal.SIGKILL)
        codes = []
        wait_for(lambda: codes.append(httpx.get(server.base + "/ping", timeout=30).status_code) or codes[-1] == 503,
                 "/ping 503 while the executor is down", 120)
        wait_for(lambda: httpx.get(server.base + "/ping", timeout=30).status_code == 200, "/ping 200 again", 300)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(120) == 0
        wait_gone(server.pgid)
