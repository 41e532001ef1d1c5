"""A server with several front ends (``python -m core serve --frontends N``) as a real process tree on loopback,
started in a process group of its own so a test can check that nothing of it is left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.server import ROOT, environ_without_settings, free_port, wait_for

START_TIMEOUT = 300.0


@pytest.fixture(scope="session")
def near_free_dir() -> Path:
    """A 1-layer, hidden-32 BERT with MiniLM's tokenizer (built once, shared with the benchmarks)."""
    from benchmarks.host_cpu import near_free_model

    return near_free_model()


def proc_stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name (state first), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return sorted(found)


class Server:
    """A running ``python -m core serve`` (its own process group); ``log()``: what it wrote so far."""

    def __init__(self, proc: subprocess.Popen, base: str, log_path: Path):
        self.proc = proc
        self.base = base
        self.log_path = log_path

    @property
    def pgid(self) -> int:
        return self.proc.pid  # started with start_new_session: the group's leader

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def frontend_pids(self) -> dict[int, int]:
        """Front-end index → pid of the last one the supervisor reported serving."""
        found = {}
        for index, pid in re.findall(r"front end (\d+) \(pid (\d+)\) serving", self.log()):
            found[int(index)] = int(pid)
        return found

    def executor_pids(self) -> dict[str, int]:
        """Device → pid of the last executor that said it serves."""
        return {device: int(pid) for device, pid in re.findall(r"executor (\S+) \(pid (\d+)\) serves", self.log())}

    def wait_serving(self, count: int, timeout: float = START_TIMEOUT) -> None:
        def serving() -> bool:
            assert self.proc.poll() is None, f"the server exited with {self.proc.returncode}:\n{self.log()[-4000:]}"
            return "serving on" in self.log() and len(self.frontend_pids()) == count

        wait_for(serving, "every front end serving", timeout)


@contextmanager
def supervised_server(models: list[dict], frontends: int, env: dict | None = None, *, name: str = "scaleout",
                      wait: bool = True, command: list[str] | None = None, cwd: Path = ROOT):
    """``python -m core serve`` (or ``command``, run in ``cwd``) with ``frontends`` front ends serving ``models`` on
    127.0.0.1:<free port>; its process group is killed at the end whatever happened."""
    port = free_port()
    full_env = environ_without_settings()
    full_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                    TESSERA_AUTO_EXPORT="false", TESSERA_PORT=str(port), TESSERA_HOST="127.0.0.1",
                    TESSERA_FRONTENDS=str(frontends), TESSERA_MODELS=json.dumps(models),
                    TESSERA_ACCESS_LOG="false")
    full_env.update(env or {})
    port = int(full_env["TESSERA_PORT"])
    log_path = ROOT / ".venv" / f"test-{name}-{port}.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(command or [sys.executable, "-m", "core", "serve"], cwd=cwd, env=full_env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(proc, f"http://127.0.0.1:{port}", log_path)
    try:
        if wait:
            server.wait_serving(frontends)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(server.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(30)


def frontend_of(response: httpx.Response) -> int:
    return int(response.headers["x-tessera-frontend"])


def wait_gone(pgid: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while group_members(pgid):
        assert time.monotonic() < deadline, f"processes of group {pgid} still running: {group_members(pgid)}"
        time.sleep(0.05)
