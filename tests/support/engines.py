"""Build one in-process Engine from a folder (the same load path as the server) and call it synchronously."""

from __future__ import annotations

from pathlib import Path

from core.config import ModelSpec, Settings
from core.engine import Engine


def load_engine(path: Path, **spec) -> Engine:
    model = ModelSpec(path=path, **spec)
    return Engine.load(model, Settings(models=[model], threads=2))
