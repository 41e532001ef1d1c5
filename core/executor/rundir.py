"""An executor set's run directory and shared-memory names, shared by the executor processes' supervisor
(``core.executor.supervisor.ExecutorSet``) and an executor run in a thread of its own process
(``core.executor.server.ThreadExecutor``): the ``executors.json`` a front end reads, the segments' name prefix,
their removal."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from core.executor import shm

ADDRESS_FILE = "executors.json"


def new_run_dir() -> Path:
    """A private directory for one executor set's sockets and ``executors.json``."""
    return Path(tempfile.mkdtemp(prefix="tessera-run-"))


def executor_socket(run_dir: Path, device: str) -> str:
    """The Unix socket the executor of ``device`` listens on."""
    return str(run_dir / f"{device.replace(':', '-')}.sock")


def new_shm_prefix() -> str:
    """A fresh name prefix for the shared-memory segments of one executor set."""
    return f"{shm.NAME_PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"


def write_address(run_dir: Path, shm_prefix: str, executors: dict[str, dict]) -> None:
    """``executors.json`` in ``run_dir`` (what ``core.executor.client.remote_registry`` reads): the segments'
    prefix and, per device, its ``socket``, ``pid`` and ``models`` (``server.model_report`` of each)."""
    tmp = run_dir / (ADDRESS_FILE + ".tmp")
    tmp.write_text(json.dumps({"shm_prefix": shm_prefix, "executors": executors}))
    tmp.replace(run_dir / ADDRESS_FILE)


def remove_segments(prefix: str) -> list[str]:
    """Unlink every shared-memory segment whose name starts with ``prefix`` (Linux: /dev/shm)."""
    removed = []
    root = Path("/dev/shm")
    if root.is_dir():
        for path in root.glob(prefix + "*"):
            shm.unlink(path.name)
            removed.append(path.name)
    return removed


def remove_run(run_dir: Path | None, shm_prefix: str) -> None:
    """What an executor set leaves once stopped: its run directory and any segment named with its prefix."""
    if run_dir is not None:
        shutil.rmtree(run_dir, ignore_errors=True)
    if shm_prefix:
        remove_segments(shm_prefix)
