"""Servers started as users start them (``python -m core serve ...``) on loopback, and a tiny CLIP."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.multimodal import tiny_models
from tests.support.cache import cached_build
from tests.support.server import ROOT, free_port, running_process


@pytest.fixture(scope="session")
def clip_dir() -> Path:
    return cached_build("tiny-clip", [Path(tiny_models.__file__)], tiny_models.build_clip)


@contextmanager
def cli_server(args: list[str], env: dict[str, str] | None = None, *, ready_path: str = "/ready",
               headers: dict[str, str] | None = None, name: str = "cli"):
    """``python -m core serve ARGS --host 127.0.0.1 --port <free>``; yields (base URL, log file path).
    The environment is this one without TESSERA_* / OTEL_* variables, plus ``env``."""
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "OTEL_"))}
    full_env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                     "TESSERA_THREADS": "2", **(env or {})})
    cmd = [sys.executable, "-m", "core", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    with running_process(cmd, full_env, port=port, ready_path=ready_path, headers=headers, name=name) as (base, _p):
        yield base, ROOT / ".venv" / f"test-{name}-{port}.log"
