"""A real ``redis-server`` on 127.0.0.1 at a free port, for the embedding cache's tests (scripts/test
installs Debian's redis-server). Started without persistence, always stopped."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

from benchmarks.loopback import free_port


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not installed (scripts/test installs it: apt-get install redis-server)")
    return found


def ping(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.mkdtemp(prefix="tessera-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30.0) -> "RedisServer":
        self.proc = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self._dir, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not ping(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not answering on port {self.port} after {timeout}s")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crashed or vanished server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def keys(self) -> int:
        """How many keys the server holds (DBSIZE)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(b"DBSIZE\r\n")
            reply = conn.recv(64)
        assert reply.startswith(b":"), reply
        return int(reply[1:].split(b"\r\n")[0])


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.stop()
