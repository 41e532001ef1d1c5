"""`backend: auto`: the choice per folder layout, the export cache (key, parity gate, fallback, reuse
without torch), specs honoured exactly or refused, `python -m core prepare`, warm-up before ready."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from core.backends.registry import choose, create_backend
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.tasks.embed import EmbedRequest
from tests.support.server import ROOT

pytestmark = pytest.mark.slow

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _linked_copy(src: Path, dst: Path, *, skip=()) -> Path:
    """A model folder whose files link to ``src``'s (cheap; the weights' content is what the key reads)."""
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if path.is_dir() or any(rel.as_posix().startswith(s) for s in skip):
            continue
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).symlink_to(path.resolve())
    return dst


@pytest.fixture(scope="session")
def exported(minilm_dir, tmp_path_factory):
    """MiniLM (torch weights only) and an export cache that `auto` filled on a first choice."""
    cache = tmp_path_factory.mktemp("export-cache")
    folder = _linked_copy(minilm_dir, tmp_path_factory.mktemp("minilm-torch") / "minilm")
    first = choose(ModelSpec(path=folder), head="encoder", cache_dir=cache)
    return folder, cache, first


def test_auto_on_cpu_exports_checks_and_caches(exported):
    folder, cache, first = exported
    assert first.backend == "onnx" and not first.fell_back
    assert "exported now" in first.reason and "worst cosine" in first.reason
    assert first.artifact is not None and first.artifact.is_relative_to(cache)
    entry = json.loads((first.artifact.parent / "entry.json").read_text())
    assert entry["min_cosine"]["last_hidden_state"] >= 0.9999
    assert set(entry["versions"]) == {"torch", "transformers", "onnx", "onnxruntime"}
    assert entry["files"]["model.safetensors"] and entry["head"] == "encoder"
    again = choose(ModelSpec(path=folder), head="encoder", cache_dir=cache)
    assert again.backend == "onnx" and again.artifact == first.artifact and "from the export cache" in again.reason
    assert not (folder / "onnx").exists()  # the model folder is never written to


def test_cache_key_follows_contents_versions_and_options(exported, tmp_path, monkeypatch):
    from core.convert import export_cache
    from core.convert import onnx_export

    folder, cache, _ = exported
    key, inputs = export_cache.cache_key(folder, head="encoder", cache_dir=cache)
    assert key == export_cache.cache_key(folder, head="encoder", cache_dir=cache)[0]  # stable
    assert key != export_cache.cache_key(folder, head="splade", cache_dir=cache)[0]
    assert key != export_cache.cache_key(folder, head="encoder", cache_dir=cache, opset=18)[0]
    monkeypatch.setattr(onnx_export, "EXPORTER_VERSION", onnx_export.EXPORTER_VERSION + "-next")
    assert key != export_cache.cache_key(folder, head="encoder", cache_dir=cache)[0]
    monkeypatch.undo()
    monkeypatch.setattr(export_cache, "_versions", lambda: {**inputs["versions"], "onnxruntime": "0.0.1"})
    assert key != export_cache.cache_key(folder, head="encoder", cache_dir=cache)[0]
    monkeypatch.undo()
    # the same file name with other contents (same size) is another key; the digest memo notices
    other = _linked_copy(folder, tmp_path / "m", skip=("config.json",))
    config = json.loads((folder / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config))
    k1 = export_cache.cache_key(other, head="encoder", cache_dir=cache)[0]
    config["layer_norm_eps"] = 2e-12
    text = json.dumps(config)
    (other / "config.json").write_text(text)
    os.utime(other / "config.json", ns=(1, 1))
    assert export_cache.cache_key(other, head="encoder", cache_dir=cache)[0] != k1


def test_a_graph_failing_the_parity_check_is_not_served(reranker_dir, tmp_path, monkeypatch):
    """A graph whose numbers differ from torch's (here: one weight changed between the reference and the
    export) is refused; the failure is recorded, so the next start falls back without exporting again."""
    from core.convert import onnx_export

    real = onnx_export.export_model

    def corrupting(model, out_file, head_name, **kw):
        import torch

        with torch.no_grad():
            next(p for n, p in model.named_parameters() if n.endswith("attention.self.query.weight")).mul_(3.0)
        return real(model, out_file, head_name, **kw)

    monkeypatch.setattr(onnx_export, "export_model", corrupting)
    spec = ModelSpec(path=reranker_dir)
    choice = choose(spec, head="sequence-classification", cache_dir=tmp_path)
    assert choice.backend == "torch" and choice.fell_back and "parity check failed" in choice.reason
    assert list(tmp_path.glob("onnx/*/failed.json")) and not list(tmp_path.glob("onnx/*/model.onnx"))

    def must_not_run(*a, **k):
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_export, "export_model", must_not_run)
    again = choose(spec, head="sequence-classification", cache_dir=tmp_path)
    assert again.backend == "torch" and "earlier export" in again.reason and "delete" in again.reason


def test_a_failing_export_falls_back_to_torch_with_the_reason(reranker_dir, tmp_path, monkeypatch):
    from core.convert import onnx_export

    def broken(*a, **k):
        raise RuntimeError("Exporting the operator 'aten::frobnicate' is not supported")

    monkeypatch.setattr(onnx_export, "export_model", broken)
    choice = choose(ModelSpec(path=reranker_dir), head="sequence-classification", cache_dir=tmp_path)
    assert choice.backend == "torch" and choice.fell_back
    assert "export failed" in choice.reason and "frobnicate" in choice.reason


def test_the_rerank_head_is_exported_with_parity(reranker_dir, tmp_path):
    choice = choose(ModelSpec(path=reranker_dir), head="sequence-classification", cache_dir=tmp_path)
    assert choice.backend == "onnx", choice.reason
    entry = json.loads((choice.artifact.parent / "entry.json").read_text())
    assert entry["min_cosine"]["logits"] >= 0.9999


def test_auto_export_off_explicit_backend_and_other_devices(exported):
    folder, cache, _ = exported
    off = choose(ModelSpec(path=folder), head="encoder", cache_dir=cache, auto_export=False)
    assert off.backend == "torch" and "TESSERA_AUTO_EXPORT=false" in off.reason
    explicit = choose(ModelSpec(path=folder, backend="torch"), head="encoder", cache_dir=cache)
    assert explicit.backend == "torch" and explicit.artifact is None and "set in the model spec" in explicit.reason
    # a named dtype on CUDA: torch at that dtype (with none, `auto` measures: tests/backends/test_fastest_precision.py)
    cuda = choose(ModelSpec(path=folder, device="cuda", dtype="float16"), head="encoder", cache_dir=cache)
    assert cuda.backend == "torch" and cuda.artifact is None and cuda.dtype is None
    int8 = choose(ModelSpec(path=folder, dtype="int8"), head="encoder", cache_dir=cache)
    assert int8.backend == "torch" and "export_onnx.py" in int8.reason


def test_settings_carry_the_cache_and_the_switch(tmp_path):
    from core.config import settings_from_env

    s = settings_from_env({"TESSERA_CACHE_DIR": str(tmp_path), "TESSERA_AUTO_EXPORT": "false"})
    assert s.cache_dir == tmp_path and s.auto_export is False
    default = settings_from_env({})
    assert default.auto_export is True and default.cache_dir.name == "tessera"


PROBE = textwrap.dedent("""
    import json, sys
    from core.config import ModelSpec, Settings
    from core.engine import Engine
    from core.tasks.embed import EmbedRequest
    folder, cache = sys.argv[1], sys.argv[2]
    spec = ModelSpec(path=folder)
    engine = Engine.load(spec, Settings(models=[spec], cache_dir=cache, threads=2, auto_export=True))
    out = engine.run_sync(EmbedRequest(texts=["a second start", "reuses the cached graph"]))
    print(json.dumps({"card": engine.describe(), "vectors": [r.tolist() for r in out.vectors],
                      "imported": sorted(m for m in ("torch", "transformers", "onnx") if m in sys.modules)}))
""")


def test_a_later_start_reuses_the_graph_without_importing_torch(exported, minilm_dir):
    folder, cache, first = exported
    proc = subprocess.run([sys.executable, "-c", PROBE, str(folder), str(cache)], env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["imported"] == []
    assert out["card"]["backend"] == "onnx" and "from the export cache" in out["card"]["backend_reason"]
    torch_engine = Engine.load(ModelSpec(path=minilm_dir, backend="torch"), Settings(threads=2))
    want = torch_engine.run_sync(EmbedRequest(texts=["a second start", "reuses the cached graph"])).vectors
    got = np.asarray(out["vectors"])
    cos = (got * np.asarray(want)).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.9999


def test_models_card_and_log_name_the_backend_and_why(exported, caplog):
    from fastapi.testclient import TestClient

    from core.api.app import create_app

    folder, cache, _ = exported
    settings = Settings(models=[{"path": str(folder), "name": "m"}], cache_dir=cache, auto_export=True, threads=2)
    with caplog.at_level("INFO", logger="core.engine"), TestClient(create_app(settings)) as client:
        card = next(m for m in client.get("/v1/models").json()["data"] if m["id"] == "m")
    assert card["backend"] == "onnx" and "export cache" in card["backend_reason"]
    assert any("model m: backend onnx (" in r.getMessage() for r in caplog.records)


# a spec is honoured exactly or refused --------------------------------------------------------

@pytest.fixture(scope="session")
def onnx_only(minilm_onnx_dir, tmp_path_factory) -> Path:
    """A folder holding only onnx/model.onnx (fp32) and the tokenizer/config files: no torch weights."""
    folder = tmp_path_factory.mktemp("onnx-only") / "minilm"
    return _linked_copy(minilm_onnx_dir, folder, skip=("onnx/model_int8", ".complete"))


def test_onnx_int8_without_an_int8_graph_is_refused_with_the_command(onnx_only):
    spec = ModelSpec(path=onnx_only, backend="onnx", dtype="int8")
    with pytest.raises(InvalidInput) as err:
        Engine.load(spec, Settings(models=[spec], threads=2))
    message = err.value.message
    assert "onnx/model_int8.onnx" in message and "--int8" in message and "scripts/export_onnx.py" in message
    assert "onnx/model.onnx" in message  # what the folder does have
    # the backend itself, loaded directly, never falls to the fp32 graph either
    from core.backends.onnx import OnnxBackend

    with pytest.raises(InvalidInput, match="--int8"):
        OnnxBackend().load(onnx_only, head="encoder", device="cpu", dtype="int8", threads=1)


def test_auto_on_an_onnx_only_folder_picks_onnx(onnx_only):
    spec = ModelSpec(path=onnx_only)
    engine = Engine.load(spec, Settings(models=[spec], threads=2))
    assert engine.describe()["backend"] == "onnx" and "onnx/model.onnx" in engine.describe()["backend_reason"]
    with pytest.raises(InvalidInput, match="--int8"):  # int8 there: no int8 graph, no weights to fall back on
        choose(ModelSpec(path=onnx_only, dtype="int8"), head="encoder")


def test_relative_onnx_file_resolves_against_the_model_folder(onnx_only, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a working directory without the file
    spec = ModelSpec(path=onnx_only, backend="onnx", onnx_file="onnx/model.onnx")
    assert spec.onnx.file == onnx_only / "onnx" / "model.onnx"
    backend = create_backend(spec, choose(spec))
    backend.load(onnx_only, head="encoder", device="cpu", dtype="float32", threads=1)
    assert backend.describe()["file"] == "model.onnx"


def test_config_file_paths_resolve_against_the_file(onnx_only, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "models").mkdir()
    (conf / "models" / "minilm").symlink_to(onnx_only, target_is_directory=True)
    (conf / "tessera.yaml").write_text(
        "models:\n  - path: models/minilm\n    backend: onnx\n    onnx_file: onnx/model.onnx\ncache_dir: cache\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TESSERA_CACHE_DIR", raising=False)  # the environment would win over the file
    s = Settings(config=str(conf / "tessera.yaml"))
    assert s.models[0].path == conf / "models" / "minilm"
    assert s.models[0].onnx.file == conf / "models" / "minilm" / "onnx" / "model.onnx"
    assert s.cache_dir == conf / "cache"


# prepare --------------------------------------------------------------------------------------

def test_prepare_fills_the_cache_serve_then_uses(exported, tmp_path):
    folder, _, _ = exported
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-m", "core", "prepare", "--model", f"{folder}:m", "--cache-dir", str(cache)],
                          env=ENV, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "m: onnx (" in proc.stdout
    assert list(cache.glob("onnx/*/model.onnx"))
    later = choose(ModelSpec(path=folder), head="encoder", cache_dir=cache)
    assert later.backend == "onnx" and "from the export cache" in later.reason


def test_prepare_reports_a_model_it_cannot_prepare(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "core", "prepare", "--model", str(tmp_path / "nope"),
                           "--cache-dir", str(tmp_path / "c")], env=ENV, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "failed" in proc.stdout


# warm-up --------------------------------------------------------------------------------------

def test_warm_up_runs_every_length_bucket_before_ready_and_changes_no_vector(minilm_onnx_dir, monkeypatch):
    from fastapi.testclient import TestClient

    from core.api.app import create_app
    from core.backends.onnx import OnnxBackend

    texts = ["warm-up must not change", "any vector", "a longer text " * 20]
    cold = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx"), Settings(threads=2), warm_up=False)
    before = cold.run_sync(EmbedRequest(texts=texts)).vectors
    shapes = cold.warm_up()
    assert cold.run_sync(EmbedRequest(texts=texts)).vectors.tolist() == before.tolist()
    lengths = [s[1] for s in shapes]
    assert lengths == [8, 8, 16, 32, 64, 128, 256]  # a lone short text, then each bucket to max_length 256
    assert all(n * length <= 512 or n == 1 for n, length in shapes)  # within the CPU token budget

    calls: list[tuple] = []
    real_run = OnnxBackend.run

    def recording(self, inputs):
        calls.append(tuple(inputs["input_ids"].shape))
        return real_run(self, inputs)

    monkeypatch.setattr(OnnxBackend, "run", recording)
    settings = Settings(models=[{"path": str(minilm_onnx_dir), "backend": "onnx"}], threads=2)
    with TestClient(create_app(settings)) as client:
        seen_at_ready = list(calls)
        assert client.get("/ready").status_code == 200
    assert seen_at_ready[: len(shapes)] == shapes


# the torch-free path ---------------------------------------------------------------------------

TORCH_FREE = textwrap.dedent("""
    import importlib.abc, json, sys

    class Blocked(importlib.abc.MetaPathFinder):  # as if torch and transformers were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers", "sentence_transformers"):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Blocked())
    from fastapi.testclient import TestClient
    from core.api.app import create_app
    from core.config import Settings
    settings = Settings(models=[{"path": sys.argv[1], "name": "m"}], threads=2, auto_export=True)
    with TestClient(create_app(settings)) as client:
        ready = client.get("/ready").status_code
        card = client.get("/v1/models").json()["data"][0]
        reply = client.post("/v1/embeddings", json={"model": "m", "input": ["no torch here"]})
    print(json.dumps({"ready": ready, "backend": card["backend"], "status": reply.status_code,
                      "dim": len(reply.json()["data"][0]["embedding"]), "torch": "torch" in sys.modules}))
""")


def test_an_onnx_folder_serves_with_torch_absent(onnx_only):
    proc = subprocess.run([sys.executable, "-c", TORCH_FREE, str(onnx_only)], env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"ready": 200, "backend": "onnx", "status": 200, "dim": 384, "torch": False}


def _torch_plan(tmp_path, **env) -> str:
    proc = subprocess.run([str(ROOT / "scripts" / "bootstrap"), "--torch-plan"], capture_output=True, text=True,
                          timeout=60, env={**{k: v for k, v in os.environ.items() if not k.startswith("TESSERA_TORCH")},
                                           **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_bootstrap_installs_the_cpu_torch_build_unless_a_gpu_is_present_or_asked_for(tmp_path):
    bare = tmp_path / "bare"  # a PATH without nvidia-smi
    bare.mkdir()
    for tool in ("bash", "dirname", "cat", "sha256sum", "cut", "python3"):
        if shutil.which(tool):
            (bare / tool).symlink_to(shutil.which(tool))
    assert _torch_plan(tmp_path, PATH=str(bare)) == "torch=cpu index=https://download.pytorch.org/whl/cpu"
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n")
    (gpu / "nvidia-smi").chmod(0o755)
    assert _torch_plan(tmp_path, PATH=f"{gpu}:{bare}").startswith("torch=cuda")
    broken = tmp_path / "broken"  # the driver tool present but no GPU: CPU
    broken.mkdir()
    (broken / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (broken / "nvidia-smi").chmod(0o755)
    assert _torch_plan(tmp_path, PATH=f"{broken}:{bare}").startswith("torch=cpu")
    assert _torch_plan(tmp_path, PATH=f"{gpu}:{bare}", TESSERA_TORCH="cpu",
                       TESSERA_TORCH_INDEX_URL="file:///mirror/cpu") == "torch=cpu index=file:///mirror/cpu"
    assert _torch_plan(tmp_path, PATH=str(bare), TESSERA_TORCH="skip").startswith("torch=skip")
