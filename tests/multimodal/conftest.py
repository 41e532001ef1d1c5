"""Tiny multi-modal model folders (built once, cached) and a loopback media server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cache import cached_build
from tests.multimodal import tiny_models
from tests.multimodal.media_support import MediaServer


def _build(name: str) -> Path:
    return cached_build(f"tiny-{name}", [Path(tiny_models.__file__)], getattr(tiny_models, f"build_{name}"))


@pytest.fixture(scope="session")
def clip_dir() -> Path:
    return _build("clip")


@pytest.fixture(scope="session")
def clap_dir() -> Path:
    return _build("clap")


@pytest.fixture(scope="session")
def colpali_dir() -> Path:
    return _build("colpali")


@pytest.fixture(scope="session")
def media_server():
    server = MediaServer()
    with server.running():
        yield server


@pytest.fixture(scope="session")
def siglip_dir() -> Path:
    return _build("siglip")
