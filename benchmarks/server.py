"""A Tessera server on loopback for a benchmark: start it, wait until it is ready, read its CPU time and
memory, stop it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT


class ServerNotReady(SystemExit):
    """The server exited, failed to load its model, or did not get ready in time. Uncaught, it ends a
    script with its message (as ``SystemExit`` does); a caller that runs several servers catches it."""


def start_server(models: list[dict], port: int, threads: int | None, extra_env: dict,
                 output=None, root: Path = ROOT, frontends: int | None = None) -> subprocess.Popen:
    """``uvicorn core.dev:app`` on 127.0.0.1:``port`` serving ``models`` (TESSERA_MODELS), from the checkout
    ``root`` (default: this one; another: its code, e.g. the commit before a change, with this Python);
    its stdout and stderr go to ``output`` (an open file) where given, else to this process's. ``frontends``:
    ``python -m core serve --frontends N`` instead (N = 1: one process; more: the supervisor, one executor per
    device and N front ends, all in the process tree a benchmark counts)."""
    env = {**os.environ, "TESSERA_MODELS": json.dumps(models), "HF_HUB_OFFLINE": "1", **extra_env}
    if Path(root) != ROOT:
        env["PYTHONPATH"] = str(root)
    if threads:
        env["TESSERA_THREADS"] = str(threads)
    if frontends is not None:
        cmd = [sys.executable, "-m", "core", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--frontends", str(frontends), "--log-level", extra_env.get("TESSERA_LOG_LEVEL", "warning")]
        return subprocess.Popen(cmd, cwd=root, env=env, stdout=output, stderr=output)
    cmd = [sys.executable, "-m", "uvicorn", "core.dev:app", "--host", "127.0.0.1", "--port", str(port),
           "--no-access-log", "--log-level", "warning", "--loop", "uvloop", "--http", "httptools"]
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=output, stderr=output)


def stop_server(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (the server drains), then SIGKILL if it has not exited after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 180, path: str = "/ready") -> float:
    """Seconds until ``url + path`` answers 200. Raises ``ServerNotReady`` at once when ``proc`` has exited
    or the answer says the model failed to load (a Tessera server then stays up answering 503), and
    after ``timeout`` seconds otherwise."""
    import httpx

    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc is not None and proc.poll() is not None:
            raise ServerNotReady(f"server at {url} exited with {proc.returncode}")
        try:
            r = httpx.get(url + path, timeout=2)
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code == 200:
            return time.perf_counter() - start
        if r is not None and "failed to load" in r.text:
            raise ServerNotReady(f"server at {url}: {_error_message(r)}")
        time.sleep(0.1)
    raise ServerNotReady(f"server at {url} not ready in {timeout:.0f} s")


def _error_message(response) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


# ---- the process's resources (Linux /proc) -----------------------------------------------------------

def process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _status_mb(pid: int, key: str) -> float | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return None


def peak_rss_mb(pid: int | None) -> float | None:
    """The process's peak resident memory (VmHWM) in MB."""
    return None if pid is None else _status_mb(pid, "VmHWM")


def rss_mb(pid: int) -> float:
    """The process's resident memory now (VmRSS) in MB; NaN where /proc does not say."""
    value = _status_mb(pid, "VmRSS")
    return float("nan") if value is None else value
