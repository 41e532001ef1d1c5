"""``ExecutorSet``: the executor processes of a server, one per device, started and watched by the
supervisor process (which loads no model itself).

Every executor is a ``multiprocessing`` *spawn* child (a fresh interpreter: no state of the supervisor
inherited), in the supervisor's process group, that dies with it (``PR_SET_PDEATHSIG``, set by the child
first thing; Linux ties it to the *thread* that started the child, so start and restart from a thread that
lives as long as the executors: the main thread). ``address`` is a private run directory: the executors'
sockets and ``executors.json`` (each device's socket and what its models are), which a front end reads
(``core.executor.client.remote_registry``)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import Settings
from core.devices import expand_devices, is_accelerator, runtime_device
from core.errors import ConfigError, StartupFailed
from core.executor.rundir import executor_socket, new_run_dir, new_shm_prefix, remove_run, write_address

log = logging.getLogger(__name__)



def plan(settings: Settings, environ=os.environ) -> dict[str, list]:
    """Device → the specs its executor loads (each with the device it runs on: ``cpu:N`` → ``cpu``); a model
    whose ``device`` lists several devices is in each of their executors."""
    devices: dict[str, list] = {}
    problems = []
    for spec in settings.model_specs():
        try:
            names = expand_devices(spec.device, environ)
        except ValueError as exc:
            problems.append(f"model {spec.served_name!r}: {exc}")
            continue
        for device in names:
            devices.setdefault(device, []).append(spec.model_copy(update={"device": runtime_device(device)}))
    if problems:
        raise ConfigError(problems)
    return devices


@dataclass
class _Executor:
    device: str
    specs: list
    socket: str
    process: Any = None
    report: dict = field(default_factory=dict)
    #: the models of this device that did not load (``allow_degraded``), by name, with why
    failed: dict = field(default_factory=dict)
    pipe: Any = None


class ExecutorSet:
    def __init__(self, settings: Settings, run_dir: Path, executors: dict[str, _Executor]):
        self.settings = settings
        self.run_dir = run_dir
        self.executors = executors
        #: the names of the shared-memory segments the front ends create for this set (removed by ``stop``)
        self.shm_prefix = new_shm_prefix()
        self._context = multiprocessing.get_context("spawn")

    @classmethod
    def start(cls, settings: Settings) -> "ExecutorSet":
        """Spawn one executor per device and block until each has loaded and warmed its models;
        ``StartupFailed`` naming the model and device when one cannot (the others are stopped). With
        ``allow_degraded`` the rule of a one-process server (``Registry.raise_if_unusable``): the models that
        loaded serve, those that failed are reported failed (``executors.json``: each device's ``failed``), and
        the start fails only when no model loaded at all."""
        devices = plan(settings)
        run_dir = new_run_dir()
        executors = {device: _Executor(device, specs, executor_socket(run_dir, device))
                     for device, specs in devices.items()}
        self = cls(settings, run_dir, executors)
        try:
            for executor in executors.values():
                self._spawn(executor)
            for executor in executors.values():
                self._wait_ready(executor)
            self._raise_if_unusable()
        except BaseException:
            self.stop(timeout=5.0)
            raise
        self._write_address()
        return self

    @property
    def address(self) -> str:
        return str(self.run_dir)

    @property
    def pids(self) -> list[int]:
        return [e.process.pid for e in self.executors.values() if e.process is not None and e.process.pid]

    def check(self) -> str | None:
        """None while every executor lives, else why not (``executor cpu:1 exited with signal 9``)."""
        for executor in self.executors.values():
            why = _exit_reason(executor)
            if why is not None:
                return why
        return None

    def restart(self) -> list[str]:
        """Start again each executor that exited (its models load again); the devices restarted."""
        restarted = []
        for executor in self.executors.values():
            if _exit_reason(executor) is None:
                continue
            log.warning("%s; restarting it", _exit_reason(executor))
            executor.process.join(timeout=1.0)
            self._spawn(executor)
            self._wait_ready(executor)
            restarted.append(executor.device)
        if restarted:
            self._write_address()
        return restarted

    def stop(self, timeout: float) -> None:
        """SIGTERM every executor (each finishes the work it has queued), wait up to ``timeout`` seconds,
        SIGKILL those left; then remove the run directory and any shared-memory segment left behind."""
        alive = [e.process for e in self.executors.values() if e.process is not None and e.process.is_alive()]
        for process in alive:
            try:
                os.kill(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        for process in alive:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in alive:
            if process.is_alive():
                log.warning("executor pid %d did not stop within %.1fs: killed", process.pid, timeout)
                process.kill()
                process.join(timeout=5.0)
        for executor in self.executors.values():
            if executor.process is not None and executor.process.exitcode is not None:
                executor.process.close()
            executor.process = None
        remove_run(self.run_dir, self.shm_prefix)

    def settings_for(self, device: str) -> Settings:
        """An executor's settings: the server's, except that CPU executors share ``threads`` (``cpu:0,cpu:1`` on a
        2-thread setting: one each), so that they do not each start a runtime pool as wide as the machine. A
        model's own ``threads`` still wins."""
        cpus = sum(1 for d in self.executors if not is_accelerator(d))
        if is_accelerator(device) or cpus < 2:
            return self.settings
        return self.settings.model_copy(update={"threads": max(1, self.settings.threads // cpus)})

    # -----------------------------------------------------------------------------------------------------
    def _spawn(self, executor: _Executor) -> None:
        from core.executor.server import executor_main

        Path(executor.socket).unlink(missing_ok=True)
        receive, send = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=executor_main, name=f"tessera-executor-{executor.device}",
            args=(self.settings_for(executor.device), executor.device, executor.specs, executor.socket, send,
                  os.getpid()))
        process.start()
        send.close()
        executor.process = process
        executor.pipe = receive

    def _wait_ready(self, executor: _Executor) -> None:
        pipe = executor.pipe
        models = ", ".join(s.served_name for s in executor.specs)
        try:
            while True:
                if pipe.poll(0.2):
                    try:
                        message = pipe.recv()
                    except EOFError:
                        message = None
                    if message is not None and message[0] == "ready":
                        executor.report = message[1]
                        executor.failed = message[2] if len(message) > 2 else {}
                        return
                    if message is not None and message[0] == "failed":
                        raise StartupFailed(f"model {message[1]!r} failed to load on {executor.device}: {message[2]}")
                    executor.process.join(timeout=5.0)
                    raise StartupFailed(f"executor {executor.device} ({models}) {_describe_exit(executor.process)} "
                                        "while loading")
                if not executor.process.is_alive():
                    raise StartupFailed(f"executor {executor.device} ({models}) {_describe_exit(executor.process)} "
                                        "while loading")
        finally:
            pipe.close()

    def failed(self) -> dict[str, str]:
        """The models no executor serves because they failed to load (``allow_degraded``): name → why, with the
        device (a model that loaded on another of its devices is served there, and not in this map)."""
        served = {name for e in self.executors.values() for name in e.report}
        return {name: f"{error} (on {e.device})" for e in self.executors.values() for name, error in e.failed.items()
                if name not in served}

    def _raise_if_unusable(self) -> None:
        """``Registry.raise_if_unusable``'s rule for the whole set (executors report a failed model only under
        ``allow_degraded``; without it the first failure already stopped the start): no model loaded anywhere."""
        if any(e.report for e in self.executors.values()):
            return
        reasons = "; ".join(f"{name}: {why}" for name, why in self.failed().items())
        raise StartupFailed(f"no model could be loaded ({reasons or 'none configured'})")

    def _write_address(self) -> None:
        write_address(self.run_dir, self.shm_prefix, {e.device: {"socket": e.socket, "pid": e.process.pid,
                                                                 "models": e.report, "failed": e.failed}
                                                      for e in self.executors.values()})


def _describe_exit(process) -> str:
    code = process.exitcode
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"exited with signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exited with signal {-code}"
    return f"exited with code {code}"


def _exit_reason(executor: _Executor) -> str | None:
    process = executor.process
    if process is None:
        return f"executor {executor.device} is not running"
    if process.is_alive():
        return None
    return f"executor {executor.device} (pid {process.pid}) {_describe_exit(process)}"

