"""A real server process on loopback for client-library tests (bounded start-up wait, always stopped)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks.loopback import free_port

__all__ = ["ROOT", "environ_without_settings", "free_port", "inflight_requests", "running_process",
           "running_server", "socket_inodes", "uvicorn_command", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]


def environ_without_settings(*prefixes: str) -> dict[str, str]:
    """This process's environment without its ``TESSERA_*`` variables (and those starting with any of
    ``prefixes``): a developer's own settings never reach a server under test."""
    drop = ("TESSERA_", *prefixes)
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def uvicorn_command(app: str, port: int, *options: str) -> list[str]:
    """``python -m uvicorn APP`` on 127.0.0.1:PORT without the access log; ``options`` added at the end."""
    return [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
            *options]


@contextmanager
def running_process(
    cmd: list[str], env: dict[str, str], *, port: int, ready_path: str = "/ready", cwd: Path = ROOT,
    timeout: float = 120.0, headers: dict[str, str] | None = None, name: str = "server",
):
    """Start ``cmd`` (a server listening on 127.0.0.1:``port``), wait until ``ready_path`` answers 200,
    yield (base URL, process), and always stop it (SIGTERM, then SIGKILL). Output goes to .venv/."""
    log = open(ROOT / ".venv" / f"test-{name}-{port}.log", "w")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {log.name}")
            try:
                if httpx.get(base + ready_path, timeout=2, headers=headers).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after {timeout}s; see {log.name}")
            time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@contextmanager
def running_server(
    env: dict[str, str] | None = None, *, app: str = "core.dev:app", timeout: float = 120.0,
    headers: dict[str, str] | None = None,
):
    """``uvicorn APP`` on 127.0.0.1:<free port>; yields the base URL once /ready answers (sent with
    ``headers``)."""
    port = free_port()
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    with running_process(uvicorn_command(app, port), full_env, port=port, timeout=timeout, headers=headers) as (base, _proc):
        yield base


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    """Poll ``condition`` (bounded) until it holds: a test waits on the server's state, not on a guess
    of how long the state takes to reach on a busy machine."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def inflight_requests(base: str) -> float:
    """The server's ``tessera_inflight_requests`` gauge (from ``/metrics``, answered outside the cap)."""
    text = httpx.get(base + "/metrics", timeout=30).text
    match = re.search(r"^tessera_inflight_requests (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def send_one_huge_header(sock) -> int:
    """Start a POST on ``sock`` whose one header grows until the server stops reading (at most 64 MB, in 64 KiB
    writes); the bytes of that header sent before the connection was cut."""
    sent = 0
    try:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        chunk = b"h" * 65536
        for _ in range(1024):  # up to 64 MB, bounded
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open (``/proc/PID/fd``: ``socket:[INODE]``)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes
