"""Executor processes on the CPU: helpers shared by the tests of core/executor."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from core.config import ModelSpec, Settings


def settings_for(*specs: dict, **extra) -> Settings:
    """Settings of ``specs`` (dicts of ModelSpec fields) with one runtime thread each (a busy 2-core machine)."""
    return Settings(models=[ModelSpec(**s) for s in specs], threads=1, **extra)


def segments(prefix: str) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(prefix + "*"))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


async def wait_for(condition, timeout: float = 60.0, step: float = 0.05) -> None:
    """Poll ``condition`` (a callable) until it is true; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(step)


@contextlib.asynccontextmanager
async def running(settings: Settings, address: str):
    """A front end's registry of the executors at ``address``, started, and stopped on the way out."""
    from core.executor import remote_registry

    registry = remote_registry(settings, address)
    await registry.start()
    try:
        yield registry
    finally:
        await registry.stop()
