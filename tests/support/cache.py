"""Artifacts built once per content of their inputs and cached under .venv/ (across sessions)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".venv" / "test-cache"
#: the sources that define what a converter writes: a change to any of them rebuilds the folders it wrote
ONNX_EXPORT_SOURCES = tuple(ROOT / "core" / p for p in ("convert/onnx_export.py", "convert/files.py",
                                                        "backends/heads.py"))
CT2_SOURCES = tuple(ROOT / "core" / p for p in ("convert/ct2.py", "convert/files.py", "backends/ct2.py"))
NEURON_SOURCES = tuple(ROOT / "core" / p for p in ("convert/neuron.py", "convert/files.py", "backends/buckets.py"))


def _dangling(folder: Path) -> bool:
    """A cached folder may link to files of a virtual environment that has since been rebuilt or moved."""
    return any(p.is_symlink() and not p.exists() for p in folder.rglob("*"))


def cached_build(name: str, inputs: list[Path], build) -> Path:
    """Build an artifact folder once per content of ``inputs`` (source files that define it)."""
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(Path(path).read_bytes())
    target = CACHE / f"{name}-{digest.hexdigest()[:12]}"
    if not (target / ".complete").exists() or _dangling(target):
        shutil.rmtree(target, ignore_errors=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        (tmp / ".complete").write_text("ok")
        tmp.rename(target)
    return target
