"""Modal's class with front ends (``TESSERA_MODAL_FRONTENDS=2``), with the real ``modal`` package: the App
definition carries a ``@modal.web_server`` endpoint (and the ASGI one with one front end) and concurrency limits
derived from the front ends; the hooks run as Modal's container runtime runs them (its own lookup), on the CPU:
after the snapshot and restore phases two front-end processes serve the port on 127.0.0.1 (``WEB_HOST``
overridden: Modal needs 0.0.0.0), answering the ``openai`` client with the one-process class's vectors; the
weights are read once, in the container's process, never in a front end; the bulk methods run on the executor's
batchers; the exit hook leaves no front end and no shared-memory segment behind."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.adapters.conftest import (MODAL_APP, MODAL_ENV, modal_env, modal_exit_phase, modal_restore_phase,
                                     modal_snapshot_phase)
from tests.adapters.contract import MODEL, THREE
from tests.support.modules import load_by_path
from tests.support.server import free_port


def _app_without_a_cap(name: str, **env: str):
    """adapters/modal/app.py loaded as ``name`` with the tests' deploy settings, no TESSERA_MODAL_MAX_INPUTS (the
    cap derived from the front ends) and ``env`` on top; the settings are put back after."""
    saved = dict(MODAL_ENV)
    MODAL_ENV.pop("TESSERA_MODAL_MAX_INPUTS", None)
    MODAL_ENV.update(env)
    try:
        with modal_env():
            return load_by_path(name, MODAL_APP)
    finally:
        MODAL_ENV.clear()
        MODAL_ENV.update(saved)


@pytest.fixture(scope="module")
def scaled_module(modal_module):
    """adapters/modal/app.py deployed with two front ends and no cap set (the cap derived from them), its front
    ends on 127.0.0.1:<free port>."""
    module = _app_without_a_cap("tessera_modal_app_scaled", TESSERA_MODAL_FRONTENDS="2",
                                 TESSERA_MODAL_PORT=str(free_port()))
    module.WEB_HOST = "127.0.0.1"  # the tests' loopback; in a container Modal's proxy needs 0.0.0.0
    return module


def _hooks(module):
    from modal._utils.async_utils import synchronizer

    return {name: synchronizer._translate_in(pf) for name, pf in module.Tessera._get_partial_functions().items()}


def _options(module):
    from modal._utils.async_utils import synchronizer

    load = synchronizer._translate_in(module.Tessera._get_class_service_function())._load
    return {name: cell.cell_contents for name, cell in zip(load.__code__.co_freevars, load.__closure__)}


def test_the_web_endpoint_follows_the_front_ends(modal_module, scaled_module):
    from modal._partial_function import _PartialFunctionFlags as Flags
    from modal_proto import api_pb2

    one, two = _hooks(modal_module)["web"].params.webhook_config, _hooks(scaled_module)["web"].params.webhook_config
    assert modal_module.PLAN.count == 1 and one.type == api_pb2.WEBHOOK_TYPE_ASGI_APP
    assert scaled_module.PLAN.count == 2 and two.type == api_pb2.WEBHOOK_TYPE_WEB_SERVER
    assert two.web_server_port == scaled_module.DEPLOY.port
    assert two.web_server_startup_timeout == scaled_module.WEB_STARTUP_TIMEOUT_S
    assert Flags.EXIT in _hooks(scaled_module)["drain"].flags
    # no cap set: 64 concurrent inputs per front end, the autoscaler's target 3/4 of it
    options = _options(scaled_module)
    assert options["max_concurrent_inputs"] == 128 and options["target_concurrent_inputs_int"] == 96
    assert _options(modal_module)["max_concurrent_inputs"] == 32  # a cap set is the container's, as given
    # the containers import the same decision: it travels in the class's environment
    env = scaled_module.DEPLOY.container_env()
    assert env["TESSERA_MODAL_FRONTENDS"] == "2" and env["TESSERA_MODAL_MAX_INPUTS"] == ""


def test_auto_sizes_the_front_ends_from_the_reserved_cores(modal_module):
    """``auto`` (the default): one process without reserved cores; with ``TESSERA_MODAL_CPU=8`` the class
    reserves 8 cores (``cpu=``) and runs 3 front ends beside the GPU's executor (core/frontends.py's rule)."""
    from modal_proto import api_pb2

    module = _app_without_a_cap("tessera_modal_app_auto", TESSERA_MODAL_CPU="8")
    assert module.PLAN.count == 3 and module.PLAN.reason.startswith("auto: 1 accelerator(s) (cuda) on 8 cores")
    assert _options(module)["cpu"] == 8.0 and _options(module)["max_concurrent_inputs"] == 192
    assert _hooks(module)["web"].params.webhook_config.type == api_pb2.WEBHOOK_TYPE_WEB_SERVER
    assert _options(modal_module)["cpu"] is None  # none reserved: Modal's default, one process


def test_one_process_says_why_in_the_model_list(modal_client):
    listed = modal_client.get("/v1/models").json()["frontends"]
    assert listed["count"] == 1 and listed["reason"].startswith("auto: 1 accelerator(s) (cuda) on 1 cores")


def _children(pid: int) -> dict[int, str]:
    """This process's live children: pid → command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found[int(entry)] = command
    return found


def _frontend_pids() -> list[int]:
    return sorted(pid for pid, command in _children(os.getpid()).items() if "core.api.frontend" in command)


def test_the_scaled_container_serves_through_its_front_ends(scaled_module, modal_client, monkeypatch):
    from openai import OpenAI

    from benchmarks.server import rss_mb
    from core.engine import Engine

    loads: list[str] = []
    load = Engine.load

    def counted(spec, *args, **kwargs):
        loads.append(spec.served_name)
        return load(spec, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", counted)
    hooks = scaled_module.Tessera._get_partial_functions()
    base = f"http://127.0.0.1:{scaled_module.DEPLOY.port}"
    before = _frontend_pids()
    obj = modal_snapshot_phase(scaled_module)
    assert loads == [MODEL] and _frontend_pids() == before  # the snapshot holds the weights, and no process more
    try:
        modal_restore_phase(obj)
        hooks["web"]._get_raw_f()(obj)  # what Modal calls before it proxies: returns once /ready answers 200
        assert loads == [MODEL]  # the snapshot's weights serve: nothing read again, in here or in a front end
        frontends = [pid for pid in _frontend_pids() if pid not in before]
        assert len(frontends) == 2
        assert httpx.get(base + "/ready", timeout=30).status_code == 200

        reference = modal_client.post("/v1/embeddings", json={"model": MODEL, "input": THREE}).json()
        reference = np.array([d["embedding"] for d in reference["data"]], dtype=np.float32)
        client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
        answer = client.embeddings.create(model=MODEL, input=THREE)
        served = np.array([d.embedding for d in answer.data], dtype=np.float32)
        np.testing.assert_allclose(served, reference, atol=1e-5)

        listed = httpx.get(base + "/v1/models", timeout=30).json()["frontends"]
        assert listed == {"count": 2, "reason": "frontends=2 was set: 2 front-end processes"}
        seen: set[str] = set()
        for i in range(200):  # a new connection each time, as Modal's proxy opens them: the kernel spreads them
            response = httpx.post(base + "/v1/embeddings", json={"model": MODEL, "input": [f"text {i}"]}, timeout=60)
            assert response.status_code == 200, response.text
            seen.add(response.headers["x-tessera-frontend"])
            if len(seen) == 2:
                break
        assert seen == {"0", "1"}

        # the bulk methods run on the executor's batchers (the same queues), with the same vectors
        shard = asyncio.run(hooks["embed_shard"]._get_raw_f()(obj, THREE))
        np.testing.assert_allclose(shard, reference, atol=1e-5)
        described = asyncio.run(hooks["describe_model"]._get_raw_f()(obj))
        assert described["name"] == MODEL and described["dimension"] == 384

        # the weights live in this process only: no front end maps a model runtime
        for pid in frontends:
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "onnxruntime" not in maps and "libtorch" not in maps, pid
        print(f"RSS: container process {rss_mb(os.getpid()):.0f} MB, front ends "
              f"{', '.join(f'{rss_mb(pid):.0f}' for pid in frontends)} MB")
        prefix, run_dir = obj.executor.shm_prefix, Path(obj.executor.address)
        assert (run_dir / "executors.json").is_file() and prefix.startswith("tessera-")
    finally:
        modal_exit_phase(obj)
    assert [pid for pid in _frontend_pids() if pid not in before] == []
    assert not any(Path(f"/proc/{pid}").exists() for pid in frontends)  # drained, exited and reaped
    assert not list(Path("/dev/shm").glob(prefix + "*")) and not run_dir.exists()
    assert not obj.supervisor.serving and obj.supervisor.status == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/ready", timeout=10)


def test_a_model_on_several_devices_is_refused(scaled_module, minilm_dir):
    from core.errors import StartupFailed

    saved = dict(MODAL_ENV)
    MODAL_ENV["TESSERA_MODELS"] = json.dumps([{"path": str(minilm_dir), "name": "two", "device": "cuda:0,cuda:1"}])
    try:
        with pytest.raises(StartupFailed, match=r"names several devices.*TESSERA_MODAL_MAX_CONTAINERS"):
            modal_snapshot_phase(scaled_module)
    finally:
        MODAL_ENV.clear()
        MODAL_ENV.update(saved)


@pytest.fixture
def serving(scaled_module):
    """A container past its restore phase and ``web``: (the instance, the port's base URL); exit hook at the end."""
    obj = modal_snapshot_phase(scaled_module)
    try:
        modal_restore_phase(obj)
        scaled_module.Tessera._get_partial_functions()["web"]._get_raw_f()(obj)
        yield obj, f"http://127.0.0.1:{scaled_module.DEPLOY.port}"
    finally:
        modal_exit_phase(obj)


def test_a_front_end_that_dies_is_started_again(serving):
    import signal

    from tests.support.server import wait_for

    obj, base = serving
    first = obj.supervisor.frontends[0].proc.pid
    os.kill(first, signal.SIGKILL)

    def replaced() -> bool:
        frontend = obj.supervisor.frontends[0]
        return frontend.proc.pid != first and frontend.ready_at is not None

    wait_for(replaced, "front end 0 started again and serving", 120)
    assert obj.supervisor.serving
    for i in range(20):  # the port keeps answering whichever front end takes the connection
        response = httpx.post(base + "/v1/embeddings", json={"model": MODEL, "input": [f"again {i}"]}, timeout=60)
        assert response.status_code == 200, response.text


def test_an_executor_that_stops_stops_the_front_ends(serving, scaled_module):
    """The executor is a thread of the container's process: it cannot be restarted in place. Its loop broken,
    the supervisor stops the front ends with the reason and the port refuses (Modal's proxy then stops taking
    inputs, and the container is replaced); ``web`` (what Modal calls at a start) fails with the reason."""
    from core.errors import StartupFailed
    from tests.support.server import wait_for

    obj, base = serving
    frontends = [f.proc.pid for f in obj.supervisor.frontends.values()]
    obj.executor.loop.call_soon_threadsafe(obj.executor.loop.stop)
    wait_for(lambda: not obj.supervisor.serving, "the supervisor stopped", 120)
    assert obj.supervisor.status == 1
    assert "executors could not be restarted" in obj.supervisor.failure and "stopped" in obj.supervisor.failure
    assert not any(Path(f"/proc/{pid}").exists() for pid in frontends)  # drained, exited and reaped
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/ready", timeout=10)
    with pytest.raises(StartupFailed, match="the front ends stopped: executors could not be restarted"):
        scaled_module.Tessera._get_partial_functions()["web"]._get_raw_f()(obj)


KILLED = r"""
import json, sys, threading
from tests.adapters.conftest import MODAL_APP, MODAL_ENV, modal_env, modal_restore_phase, modal_snapshot_phase
from tests.support.modules import load_by_path

MODAL_ENV.update(json.loads(sys.argv[1]))
with modal_env():
    module = load_by_path("tessera_modal_app_killed", MODAL_APP)
module.WEB_HOST = "127.0.0.1"
obj = modal_snapshot_phase(module)
modal_restore_phase(obj)
module.Tessera._get_partial_functions()["web"]._get_raw_f()(obj)
print(json.dumps({"frontends": [f.proc.pid for f in obj.supervisor.frontends.values()],
                  "prefix": obj.executor.shm_prefix}), flush=True)
threading.Event().wait()  # serving until killed
"""


def test_the_container_process_killed_takes_its_front_ends(scaled_module, tmp_path):
    """SIGKILL of the container's process (no exit hook runs): the kernel kills every front end
    (``PR_SET_PDEATHSIG``)."""
    import select
    import signal
    import subprocess
    import sys

    from tests.support.server import ROOT, wait_for

    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    config = {**MODAL_ENV, "TESSERA_MODAL_FRONTENDS": "2", "TESSERA_MODAL_PORT": str(free_port())}
    config.pop("TESSERA_MODAL_MAX_INPUTS", None)
    log = open(tmp_path / "container.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", KILLED, json.dumps(config)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 240)
        line = proc.stdout.readline() if ready else ""
        assert line, f"the container did not serve: {(tmp_path / 'container.log').read_text()[-3000:]}"
        started = json.loads(line)
        assert len(started["frontends"]) == 2
        assert all(Path(f"/proc/{pid}").exists() for pid in started["frontends"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)

        def gone() -> bool:
            return not any(Path(f"/proc/{pid}").exists() for pid in started["frontends"])

        wait_for(gone, "the front ends gone after SIGKILL of the container process", 60)
        assert not list(Path("/dev/shm").glob(started["prefix"] + "*"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
