"""``allow_degraded`` with several front ends: the rule of a one-process server. A model that fails to load beside
one that loads: the good one serves, the broken one is reported failed (``/ready``) and its requests get the same
503 ``not_ready``; with no model loaded at all the start fails with one line."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import assert_error, client_for
from tests.scaleout.conftest import supervised_server, wait_gone


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory):
    """A model folder whose config names no model: it cannot load."""
    folder = tmp_path_factory.mktemp("broken-model")
    (folder / "config.json").write_text("{}")
    return folder


def _models(near_free_dir, broken_dir) -> list[dict]:
    return [{"path": str(near_free_dir), "name": "nf", "backend": "torch"},
            {"path": str(broken_dir), "name": "broken", "backend": "torch"}]


def _answers(get, post) -> dict:
    """What a client sees of the two models: readiness, the model list, and a request to each."""
    ready = get("/ready")
    assert ready.status_code == 200, ready.text
    listed = [card["id"] for card in get("/v1/models").json()["data"]]
    good = post("/v1/embeddings", json={"model": "nf", "input": ["a text", "another"]})
    assert good.status_code == 200, good.text
    assert len(good.json()["data"]) == 2
    bad = assert_error(post("/v1/embeddings", json={"model": "broken", "input": "a text"}), 503, "not_ready")
    return {"ready": ready.json(), "listed": listed, "broken": bad}


def test_a_broken_model_beside_a_good_one_serves_degraded_with_two_front_ends(near_free_dir, broken_dir):
    """With ``frontends: 2`` the server exited ("executors failed to start") where one process served."""
    models = _models(near_free_dir, broken_dir)
    with client_for(models=models, allow_degraded=True) as client:
        one = _answers(client.get, client.post)
    with supervised_server(models, 2, {"TESSERA_ALLOW_DEGRADED": "true"}, name="degraded") as server:
        with httpx.Client(base_url=server.base, timeout=60) as client:
            several = _answers(client.get, client.post)
        assert "model broken failed to load on cpu" in server.log()
    assert several["listed"] == one["listed"] == ["nf"]
    assert several["ready"]["models"]["nf"] == one["ready"]["models"]["nf"] == "ready"
    assert several["ready"]["status"] == one["ready"]["status"] == "ready"
    # the same reason, the multi-process one naming the device the model failed on
    assert one["ready"]["models"]["broken"].startswith("failed to load: ")
    assert several["ready"]["models"]["broken"].startswith(one["ready"]["models"]["broken"] + " (on cpu")
    assert several["broken"]["message"].startswith(one["broken"]["message"] + " (on cpu")
    assert several["broken"]["type"] == one["broken"]["type"]


def test_with_no_model_loaded_the_degraded_start_still_fails(broken_dir):
    models = [{"path": str(broken_dir), "name": "broken", "backend": "torch"}]
    with supervised_server(models, 2, {"TESSERA_ALLOW_DEGRADED": "true"}, name="degraded-none",
                           wait=False) as server:
        assert server.proc.wait(300) == 1
        log = server.log()
        assert "executors failed to start: no model could be loaded (broken: " in log, log
        assert "front end 0 started" not in log
        wait_gone(server.pgid)
