"""Models with their own code (config ``auto_map``) in the converters and under ``auto``, on a tiny
jina-embeddings-v3-style model: built-in ``model_type: xlm-roberta`` whose ``AutoModel`` is its own code
(task adapters on the encoder's output). transformers' built-in XLM-R class loads the same weights without
complaint and computes other vectors, so:

- ``scripts/export_onnx.py`` and ``scripts/convert_ct2.py`` refuse such a model without ``--trust-remote-code``;
  with it, the export runs the model's own code and is checked against it (sentence-transformers loading the
  model with its code is the reference), the CTranslate2 conversion (the built-in class, by construction) is
  checked and refused;
- a graph not recorded as made from the model's own code (``onnx/parity.json``) is never served for it: ``auto``
  serves torch, ``backend: onnx`` is refused naming the command that makes a good one;
- a NomicBert-style model (``model_type: nomic_bert``, code in another repository) is refused with a message,
  not transformers' ValueError."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import Unsupported
from core.tasks.embed import EmbedRequest
from tests.support import family_models, text_models
from tests.support.cache import cached_build
from tests.support.server import ROOT

SOURCES = [Path(family_models.__file__), Path(text_models.__file__)]
MIN_COSINE, MAX_ABS = 0.99999, 1e-5
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
EXPORT_SOURCES = [ROOT / "scripts" / "export_onnx.py", *(ROOT / "core" / p for p in (
    "convert/onnx_export.py", "convert/files.py", "backends/heads.py", "convert/export_cache.py"))]


def _script(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session")
def jina_dir(minilm_dir) -> Path:
    return cached_build("tiny-jina-v3-style", SOURCES, partial(family_models.build_jina_style, minilm_dir))


@pytest.fixture(scope="session")
def jina_onnx_dir(jina_dir) -> Path:
    """Exported as a user does: scripts/export_onnx.py --trust-remote-code."""
    pytest.importorskip("onnxruntime")

    def build(out: Path) -> None:
        run = _script("scripts/export_onnx.py", str(jina_dir), str(out), "--trust-remote-code")
        assert run.returncode == 0, run.stderr[-3000:]

    return cached_build("tiny-jina-v3-style-onnx", [*SOURCES, *EXPORT_SOURCES], build)


@pytest.fixture(scope="session")
def jina_reference(jina_dir, sentences) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(jina_dir), device="cpu", trust_remote_code=True)
    assert type(st[0].auto_model).__name__ == "LoRAXLMRoberta"
    return st.encode(sentences, batch_size=16, convert_to_numpy=True)


def _plain_class_vectors(folder: Path, texts: list[str]) -> np.ndarray:
    """The vectors of transformers' built-in XLM-R class on the same weights (what a plain conversion serves)."""
    import torch
    from transformers import AutoTokenizer, XLMRobertaModel

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = XLMRobertaModel.from_pretrained(str(folder), add_pooling_layer=False).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def _check(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape
    cos, diff = (got * ref).sum(1), np.abs(got - ref).max()
    print(f"\n[parity] jina-v3-style {what}: max abs diff {diff:.2e}, min cosine {cos.min():.7f}")
    assert cos.min() >= MIN_COSINE and diff <= MAX_ABS, f"{what}: worst cosine {cos.min():.7f}, diff {diff:.2e}"


def test_the_built_in_class_computes_other_vectors(jina_dir, jina_reference, sentences):
    """Why a plain conversion must never serve this model: far from the model's own vectors."""
    plain = _plain_class_vectors(jina_dir, sentences)
    worst = float((plain * jina_reference).sum(1).min())
    print(f"\n[custom code] built-in XLM-R class vs the model's own code: worst cosine {worst:.3f}")
    assert worst < 0.9


def test_torch_with_trust_remote_code_matches_the_models_own_code(jina_dir, jina_reference, sentences):
    engine = Engine.load(ModelSpec(path=jina_dir, backend="torch", trust_remote_code=True), Settings(threads=2))
    _check(engine.run_sync(EmbedRequest(texts=sentences)).vectors, jina_reference, "torch")


def test_export_without_trust_remote_code_is_refused(jina_dir, tmp_path):
    run = _script("scripts/export_onnx.py", str(jina_dir), str(tmp_path / "out"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "own code (AutoModel → modeling_lora.LoRAXLMRoberta)" in run.stderr
    assert "--trust-remote-code" in run.stderr and "trust_remote_code: true" in run.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend", ["onnx", "auto"])
def test_export_with_trust_remote_code_serves_the_models_own_vectors(jina_onnx_dir, jina_reference, sentences,
                                                                      backend):
    record = json.loads((jina_onnx_dir / "onnx" / "parity.json").read_text())
    assert record["own_code"] == "AutoModel → modeling_lora.LoRAXLMRoberta"
    assert record["model_class"] == "LoRAXLMRoberta" and record["checked"]["model.onnx"] >= 0.9999
    spec = ModelSpec(path=jina_onnx_dir, backend=backend, trust_remote_code=True)
    engine = Engine.load(spec, Settings(threads=2))
    assert engine.backend.name == "onnx", engine.choice.reason
    # the graph takes a task id; the reference ran the model's default task (tests/parity/test_task_adapters_parity.py)
    request = EmbedRequest(texts=sentences, task="text-matching")
    _check(engine.run_sync(request).vectors, jina_reference, f"onnx ({backend})")


@pytest.fixture(scope="session")
def jina_with_plain_graph(jina_dir, tmp_path_factory) -> Path:
    """The model folder with a graph of the built-in class beside it (what the exporter used to write)."""
    from transformers import XLMRobertaModel

    from core.convert.onnx_export import export_model

    folder = tmp_path_factory.mktemp("jina-plain-graph")
    for path in jina_dir.iterdir():
        (folder / path.name).symlink_to(path.resolve())
    plain = XLMRobertaModel.from_pretrained(str(jina_dir), add_pooling_layer=False).eval()
    export_model(plain, folder / "onnx" / "model.onnx", "encoder")
    return folder


def test_auto_serves_torch_over_a_graph_not_made_from_the_models_code(jina_with_plain_graph, jina_reference,
                                                                       sentences):
    engine = Engine.load(ModelSpec(path=jina_with_plain_graph, trust_remote_code=True), Settings(threads=2))
    assert engine.backend.name == "torch"
    assert "own code" in engine.choice.reason and "onnx/model.onnx not recorded" in engine.choice.reason
    _check(engine.run_sync(EmbedRequest(texts=sentences)).vectors, jina_reference, "auto over a plain graph")


def test_backend_onnx_refuses_a_graph_not_made_from_the_models_code(jina_with_plain_graph):
    with pytest.raises(Unsupported, match=r"runs its own code .* not recorded as converted from that code.*"
                                          r"export_onnx.py .* --trust-remote-code"):
        Engine.load(ModelSpec(path=jina_with_plain_graph, backend="onnx", trust_remote_code=True), Settings(threads=2))


def test_ct2_conversion_is_refused_without_trust_and_checked_with_it(jina_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    run = _script("scripts/convert_ct2.py", str(jina_dir), str(tmp_path / "a"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "own code (AutoModel → modeling_lora.LoRAXLMRoberta)" in run.stderr and "--trust-remote-code" in run.stderr
    # with the model's code as the reference, the conversion (the built-in class) misses it and is removed
    run = _script("scripts/convert_ct2.py", str(jina_dir), str(tmp_path / "b"), "--trust-remote-code")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "worst cosine" in run.stderr and "backend torch" in run.stderr
    assert not (tmp_path / "b" / "ct2").exists()


def test_ct2_backend_refuses_an_unchecked_conversion(jina_dir, tmp_path):
    """A CTranslate2 folder converted before (no ct2/parity.json) is not served for the model."""
    pytest.importorskip("ctranslate2")
    from core.convert.ct2 import convert_folder

    plain = tmp_path / "plain"
    plain.mkdir()
    for path in jina_dir.iterdir():
        if path.name != "modeling_lora.py":
            (plain / path.name).symlink_to(path.resolve())
    config = json.loads((jina_dir / "config.json").read_text())
    (plain / "config.json").unlink()
    (plain / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "auto_map"}))
    out = convert_folder(plain, tmp_path / "out")
    (out / "config.json").write_text(json.dumps(config))  # the model's own config, as in its repository
    with pytest.raises(Unsupported, match="not recorded as converted from that code.*convert_ct2.py"):
        Engine.load(ModelSpec(path=out, backend="ct2", trust_remote_code=True), Settings(threads=2))
    from core.backends.registry import choose

    choice = choose(ModelSpec(path=out, trust_remote_code=True), head="encoder", auto_export=False)
    assert choice.backend == "torch" and "ct2/model.bin not recorded as converted" in choice.reason


@pytest.fixture(scope="session")
def nomic_dir(minilm_dir) -> Path:
    return cached_build("tiny-nomic-style", SOURCES, partial(family_models.build_nomic_style, minilm_dir))


@pytest.mark.parametrize("trust", [False, True])
def test_nomic_style_export_is_refused_with_a_message(nomic_dir, tmp_path, trust):
    run = _script("scripts/export_onnx.py", str(nomic_dir), str(tmp_path / "out"),
                  *(["--trust-remote-code"] if trust else []))
    assert run.returncode == 2 and "Traceback" not in run.stderr and "ValueError" not in run.stderr, run.stderr
    assert "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel" in run.stderr
    assert ("could not be loaded" if trust else "--trust-remote-code") in run.stderr
    assert "backend torch" in run.stderr
