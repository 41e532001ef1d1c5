"""The loopback media server of the multi-modal tests (their tiny model folders are session fixtures of
tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.multimodal.media_support import MediaServer


@pytest.fixture(scope="session")
def media_server():
    server = MediaServer()
    with server.running():
        yield server
