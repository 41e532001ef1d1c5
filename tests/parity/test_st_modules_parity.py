"""Parity with sentence-transformers for every module combination it saves (Pooling modes, Dense modules
with their activations, Normalize before/after Dense, include_prompt) on torch, ONNX (our exporter) and
CTranslate2 (our converter), batched == single; the spec's pooling override; refusal of unknown modules.

Pipelines are built from sentence-transformers' own modules and written by ``SentenceTransformer.save``
(tests/support/text_models.py ``ST_PIPELINES``); references come from ``SentenceTransformer.encode``."""

from __future__ import annotations

import importlib.util
import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import TesseraError, Unsupported
from core.tasks.embed import EmbedRequest
from tests.support import text_models
from tests.support.cache import CT2_SOURCES, ONNX_EXPORT_SOURCES, cached_build
from tests.support.engines import run_concurrently

SETTINGS = Settings(threads=2)
SOURCE = Path(text_models.__file__)
NAMES = list(text_models.ST_PIPELINES)
BACKENDS = {"torch": "torch", "onnx": "onnxruntime", "ct2": "ctranslate2"}
#: fp32 everywhere: the worst item must match the reference this closely
MIN_COSINE, MAX_ABS = 0.99999, 1e-5


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="session")
def tiny_bert_dir(minilm_dir) -> Path:
    return cached_build("tiny-bert-encoder", [SOURCE], partial(text_models.build_tiny_bert, minilm_dir))


@pytest.fixture(scope="session")
def pipeline_dirs(tiny_bert_dir):
    built: dict[tuple[str, str], Path] = {}

    def get(name: str, backend: str = "torch") -> Path:
        key = (name, backend)
        if key in built:
            return built[key]
        if not _installed(BACKENDS[backend]):
            pytest.skip(f"the {backend} extra is not installed here")
        st_dir = cached_build(f"st-pipeline-{name.replace('+', '_')}", [SOURCE],
                              partial(text_models.build_st_pipeline, tiny_bert_dir, name=name))
        if backend == "torch":
            built[key] = st_dir
        elif backend == "onnx":
            from core.convert import onnx_export

            built[key] = cached_build(f"st-pipeline-{name.replace('+', '_')}-onnx",
                                      [SOURCE, *ONNX_EXPORT_SOURCES],
                                      lambda out: onnx_export.export_folder(st_dir, out))
        else:
            from core.convert import ct2

            built[key] = cached_build(f"st-pipeline-{name.replace('+', '_')}-ct2", [SOURCE, *CT2_SOURCES],
                                      lambda out: ct2.convert_folder(st_dir, out))
        return built[key]

    return get


@pytest.fixture(scope="session")
def references(pipeline_dirs, sentences):
    cache: dict[str, np.ndarray] = {}

    def get(name: str) -> np.ndarray:
        if name not in cache:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(str(pipeline_dirs(name)), device="cpu")
            kwargs = {} if text_models.ST_PIPELINES[name][4] else {"prompt_name": "query"}
            cache[name] = st.encode(sentences, batch_size=16, convert_to_numpy=True, **kwargs)
        return cache[name]

    return get


def _request(name: str, texts: list[str]) -> EmbedRequest:
    include_prompt = text_models.ST_PIPELINES[name][4]
    return EmbedRequest(texts=texts, prompt_name=None if include_prompt else "query")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("name", NAMES)
def test_parity_with_sentence_transformers(pipeline_dirs, references, sentences, name, backend):
    folder = pipeline_dirs(name, backend)
    engine = Engine.load(ModelSpec(path=folder, backend=backend), SETTINGS)
    assert engine.backend.name == backend
    ref = references(name)
    got = engine.run_sync(_request(name, sentences)).vectors
    assert got.shape == ref.shape, f"{name}: {got.shape} vs sentence-transformers {ref.shape}"
    cos, diff = _cosines(got, ref), np.abs(got - ref).max()
    print(f"\n[parity] {name} {backend}: max abs diff {diff:.2e}, min cosine {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE, f"{name}/{backend}: worst cosine {cos.min():.7f}"
    assert diff <= MAX_ABS, f"{name}/{backend}: max abs diff {diff:.2e}"
    # the items differ from each other far more than from their reference: the check can tell vectors apart
    assert np.abs(ref - ref.mean(axis=0)).mean() > 100 * MAX_ABS
    assert engine.task.describe()["dimension"] == ref.shape[1]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_batched_through_batcher_equals_single(pipeline_dirs, sentences, backend):
    """Concurrent requests share padded batches; each equals its own one-item run, for every pipeline."""
    texts = sentences[:24]
    for name in NAMES:
        engine = Engine.load(ModelSpec(path=pipeline_dirs(name, backend), backend=backend), SETTINGS)
        singles = np.stack([engine.run_sync(_request(name, [t])).vectors[0] for t in texts])
        batched = np.stack([r.vectors[0] for r in run_concurrently(engine, [_request(name, [t]) for t in texts])])
        np.testing.assert_allclose(batched, singles, atol=2e-5, err_msg=f"{name}/{backend}")


@pytest.mark.parametrize("override,mode", [("cls", "cls"), ("last-token", "lasttoken"), ("max", "max"),
                                           ("weightedmean", "weightedmean"), ("mean+max", ("mean", "max"))])
def test_spec_pooling_override_matches_sentence_transformers_with_that_pooling(pipeline_dirs, sentences, override,
                                                                               mode):
    """``pooling`` in the spec (TEI's --pooling) replaces the folder's Pooling mode; the Dense modules after
    it still run. A mode whose width differs from what the Dense takes is refused."""
    from sentence_transformers import SentenceTransformer, models

    folder = pipeline_dirs("max")  # no Dense: any width works
    st = SentenceTransformer(str(folder), device="cpu")
    st._modules["1"] = models.Pooling(32, pooling_mode=mode)
    ref = st.encode(sentences, batch_size=16, convert_to_numpy=True)
    engine = Engine.load(ModelSpec(path=folder, backend="torch", pooling=override), SETTINGS)
    got = engine.run_sync(EmbedRequest(texts=sentences)).vectors
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= MAX_ABS
    assert engine.task.describe()["pooling"] == "+".join(mode) if isinstance(mode, tuple) else mode


def test_pooling_override_that_breaks_the_dense_input_is_refused(pipeline_dirs):
    with pytest.raises(TesseraError, match="Dense module takes 32 features but receives 64"):
        Engine.load(ModelSpec(path=pipeline_dirs("mean-dense2-norm"), backend="torch", pooling="mean+max"), SETTINGS)
    with pytest.raises(TesseraError, match="unknown pooling mode 'splade'"):
        Engine.load(ModelSpec(path=pipeline_dirs("max"), backend="torch", pooling="splade"), SETTINGS)


def _with_module(src: Path, dst: Path, kind: str, path: str = "9_Extra", config: dict | None = None) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    modules = json.loads((dst / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": path, "type": kind})
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / path).mkdir(exist_ok=True)
    (dst / path / "config.json").write_text(json.dumps(config or {}))
    return dst


@pytest.mark.parametrize("kind", ["sentence_transformers.models.LayerNorm",
                                  "sentence_transformers.sentence_transformer.modules.dropout.Dropout",
                                  "my_package.modules.Projection",
                                  "sentence_transformers.models.WeightedLayerPooling"])
@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_module_tessera_does_not_implement_fails_the_load_naming_it(pipeline_dirs, tmp_path, kind, backend):
    folder = _with_module(pipeline_dirs("mean-dense2-norm", backend), tmp_path / "m", kind)
    with pytest.raises(Unsupported, match=kind.replace(".", r"\.")):
        Engine.load(ModelSpec(path=folder, backend=backend), SETTINGS)


def test_a_dense_activation_tessera_does_not_implement_is_refused(pipeline_dirs, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(pipeline_dirs("lasttoken-dense-silu"), folder)
    cfg = json.loads((folder / "2_Dense" / "config.json").read_text())
    cfg["activation_function"] = "torch.nn.modules.activation.PReLU"
    (folder / "2_Dense" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Unsupported, match="PReLU"):
        Engine.load(ModelSpec(path=folder, backend="torch"), SETTINGS)


def test_old_sentence_transformers_type_names_and_legacy_pooling_flags(pipeline_dirs, references, sentences,
                                                                       tmp_path):
    """Folders published with sentence-transformers 2.x: ``sentence_transformers.models.Dense`` type names and
    ``pooling_mode_*_tokens`` flags (several true: concatenated in sentence-transformers' order)."""
    folder = tmp_path / "old"
    shutil.copytree(pipeline_dirs("mean+max-dense-residual"), folder)
    modules = json.loads((folder / "modules.json").read_text())
    for m in modules:
        m["type"] = "sentence_transformers.models." + m["type"].rsplit(".", 1)[-1]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": True, "pooling_mode_mean_sqrt_len_tokens": False}))
    got = Engine.load(ModelSpec(path=folder, backend="torch"), SETTINGS).run_sync(EmbedRequest(texts=sentences))
    # sentence-transformers' legacy order is cls, max, mean…: max first, then mean
    ref_folder = tmp_path / "ref"
    shutil.copytree(folder, ref_folder)
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(ref_folder), device="cpu").encode(sentences, batch_size=16, convert_to_numpy=True)
    assert np.abs(got.vectors - ref).max() <= MAX_ABS


BLOCK_TORCH = """
import sys, json, numpy as np
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "sentence_transformers"):
            raise ImportError(f"{name} is blocked: the ONNX path must not need it")
sys.meta_path.insert(0, Block())
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.tasks.embed import EmbedRequest
texts = json.loads(sys.argv[2])
engine = Engine.load(ModelSpec(path=sys.argv[1], backend="onnx"), Settings(threads=1))
np.save(sys.argv[3], engine.run_sync(EmbedRequest(texts=texts)).vectors)
assert "torch" not in sys.modules
"""


def test_an_exported_dense_folder_serves_on_onnx_without_torch(pipeline_dirs, references, sentences, tmp_path):
    """The source keeps its Dense weights as pytorch_model.bin; the exporter rewrites them as safetensors,
    so the ONNX folder loads and matches sentence-transformers with torch unimportable."""
    import subprocess
    import sys

    name = "cls-dense-gelu-bin"
    assert (pipeline_dirs(name) / "2_Dense" / "pytorch_model.bin").exists()
    folder = pipeline_dirs(name, "onnx")
    out = tmp_path / "vectors.npy"
    run = subprocess.run([sys.executable, "-c", BLOCK_TORCH, str(folder), json.dumps(sentences[:8]), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert np.abs(np.load(out) - references(name)[:8]).max() <= MAX_ABS


def test_models_and_tei_info_report_the_pipeline(pipeline_dirs):
    from fastapi.testclient import TestClient

    from core.api.app import create_app

    specs = [ModelSpec(path=pipeline_dirs("mean-dense2-norm"), name="dense", backend="torch", pooling="cls")]
    with TestClient(create_app(Settings(models=specs, threads=2))) as client:
        r = client.post("/v1/embeddings", json={"model": "dense", "input": ["hello"]})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"][0]["embedding"]) == 16  # after both Dense modules
        assert client.get("/info").json()["model_type"] == {"embedding": {"pooling": "cls"}}


def test_dense_path_serves_another_dense_module_as_sentence_transformers_would(pipeline_dirs, sentences, tmp_path):
    """``dense_path`` (TEI's --dense-path) runs the Dense module of another folder in place of the one
    modules.json names, as a model that ships one Dense module per output size (2_Dense_256, 2_Dense_1024) is
    served; the reference is sentence-transformers with that module in the pipeline."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    folder = tmp_path / "two-denses"
    shutil.copytree(pipeline_dirs("cls-dense-gelu-bin"), folder, symlinks=True)
    torch.manual_seed(5)
    other = models.Dense(32, 8, activation_function=torch.nn.GELU())
    (folder / "2_Dense_8").mkdir()
    other.save(str(folder / "2_Dense_8"))
    st = SentenceTransformer(str(folder), device="cpu")
    assert isinstance(st._modules["2"], models.Dense)
    st._modules["2"] = other
    ref = st.encode(sentences, batch_size=16, convert_to_numpy=True)
    engine = Engine.load(ModelSpec(path=folder, backend="torch", dense_path="2_Dense_8"), SETTINGS)
    got = engine.run_sync(EmbedRequest(texts=sentences)).vectors
    assert got.shape == ref.shape == (len(sentences), 8)
    assert np.abs(got - ref).max() <= MAX_ABS
    default = Engine.load(ModelSpec(path=folder, backend="torch"), SETTINGS).run_sync(EmbedRequest(texts=sentences))
    assert default.vectors.shape[1] == 20  # without it, the module modules.json names
    with pytest.raises(TesseraError, match="has no config.json"):
        Engine.load(ModelSpec(path=folder, backend="torch", dense_path="2_Dense_missing"), SETTINGS)
    with pytest.raises(TesseraError, match="modules.json lists 2"):
        Engine.load(ModelSpec(path=pipeline_dirs("mean-dense2-norm"), backend="torch", dense_path="2_Dense"),
                    SETTINGS)
