"""The setting ``frontends`` and how ``auto`` sizes it (``core.frontends``), and what ``/v1/models`` says."""

from __future__ import annotations

import pytest

from core.cli import read_command_line, settings_from_args
from core.config import settings_from_env
from core.errors import ConfigError
from core.frontends import MAX_AUTO, ONE_PROCESS, plan_frontends


def test_auto_keeps_one_process_on_a_cpu_only_server():
    for cpus in (2, 16, 64):
        plan = plan_frontends("auto", ["cpu", "cpu"], cpus=cpus)
        assert plan.count == 1
        assert "CPU only" in plan.reason and f"all {cpus} cores" in plan.reason
        assert "docs/benchmarks.md#front-ends-on-a-cpu" in plan.reason  # the measurement behind the rule


def test_auto_with_accelerators_is_one_front_end_per_two_spare_cores_capped():
    assert plan_frontends("auto", ["cuda"], cpus=16).count == 7  # 15 cores beside one executor
    assert plan_frontends("auto", ["cuda:0", "cuda:1", "cpu"], cpus=16).count == 7  # 14 beside the GPUs
    assert plan_frontends("auto", ["cuda:0", "cuda:1", "cuda:0"], cpus=8).count == 3
    assert plan_frontends("auto", ["cuda"], cpus=64).count == MAX_AUTO
    assert plan_frontends("auto", ["neuron"], cpus=4).count == 1
    assert plan_frontends("auto", ["cuda"], cpus=2).count == 1  # never fewer than one
    reason = plan_frontends("auto", ["cuda:0", "cuda:1"], cpus=16).reason
    assert "2 accelerator(s) (cuda:0, cuda:1) on 16 cores: 14 cores beside their executors" in reason


def test_auto_with_a_model_on_several_devices_starts_front_ends():
    plan = plan_frontends("auto", ["cpu:0,cpu:1"], cpus=2)
    assert plan.count == 2 and "a model's device (cpu:0,cpu:1) is served by executor processes" in plan.reason
    # one cpu:N is an executor's device too (core.devices.is_device_list, the rule the registry refuses by)
    assert plan_frontends("auto", ["cpu:1"], cpus=2).count == 2
    assert plan_frontends("auto", ["cuda:*"], cpus=2).count == 2
    assert plan_frontends("auto", ["cuda:0,cuda:1"], cpus=16).count == 7
    assert plan_frontends(1, ["cpu:0,cpu:1"], cpus=2).count == 1  # as set (the single process then refuses it)


def test_a_number_is_used_as_given():
    assert plan_frontends(3, ["cpu"], cpus=2).count == 3
    assert plan_frontends(1, ["cuda"], cpus=64).count == 1
    assert plan_frontends(1, ["cuda"], cpus=64).reason == "frontends=1 was set: one process"


def test_the_setting_from_the_environment_and_the_command_line():
    assert settings_from_env({}).frontends == "auto"
    assert settings_from_env({"TESSERA_FRONTENDS": "4"}).frontends == 4
    assert settings_from_env({"TESSERA_FRONTENDS": "Auto"}).frontends == "auto"
    args, compat = read_command_line(["serve", "--frontends", "2"], {})
    assert settings_from_args(args, compat).frontends == 2
    for bad in ("0", "two", "-1", "1.5"):
        with pytest.raises(ConfigError, match="frontends"):
            settings_from_env({"TESSERA_FRONTENDS": bad})


def test_v1_models_says_one_process_where_the_entry_point_sets_nothing():
    from starlette.testclient import TestClient

    from core.api.app import create_app
    from core.engine import Registry
    from core.frontends import FrontendPlan

    app = create_app(settings_from_env({}), Registry(), fail_unusable=False)
    client = TestClient(app)  # no lifespan: the route alone
    assert client.get("/v1/models").json()["frontends"] == ONE_PROCESS.as_dict()
    app.state.frontends = FrontendPlan(3, "frontends=3 was set: 3 front-end processes")
    assert client.get("/v1/models").json()["frontends"] == {"count": 3,
                                                           "reason": "frontends=3 was set: 3 front-end processes"}


def test_the_listening_socket_is_bound_once_for_every_address_family():
    import socket

    from core.errors import StartupFailed
    from core.supervisor import bind_listener

    v4 = bind_listener("127.0.0.1", 0)
    try:
        assert v4.family == socket.AF_INET and v4.get_inheritable()
        port = v4.getsockname()[1]
        with pytest.raises(StartupFailed, match=f"cannot listen on 127.0.0.1:{port}: .*--port or TESSERA_PORT"):
            bind_listener("127.0.0.1", port)
    finally:
        v4.close()
    named = bind_listener("localhost", 0)
    named.close()
    if socket.has_ipv6:
        try:
            v6 = bind_listener("::1", 0)
        except StartupFailed as exc:  # a host without an IPv6 loopback
            pytest.skip(exc.message)
        assert v6.family == socket.AF_INET6
        v6.close()
