"""Servers started as users start them (``python -m core serve ...``) on loopback."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from tests.support.server import ROOT, environ_without_settings, free_port, running_process

@contextmanager
def cli_server(args: list[str], env: dict[str, str] | None = None, *, ready_path: str = "/ready",
               headers: dict[str, str] | None = None, name: str = "cli"):
    """``python -m core serve ARGS --host 127.0.0.1 --port <free>``; yields (base URL, log file path).
    The environment is this one without TESSERA_* / OTEL_* variables, plus ``env``."""
    port = free_port()
    full_env = environ_without_settings("OTEL_")
    full_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                     "TESSERA_THREADS": "2", **(env or {})})
    cmd = [sys.executable, "-m", "core", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    with running_process(cmd, full_env, port=port, ready_path=ready_path, headers=headers, name=name) as (base, _p):
        yield base, ROOT / ".venv" / f"test-{name}-{port}.log"
