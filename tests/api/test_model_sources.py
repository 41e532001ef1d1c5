"""Model sources: Hugging Face Hub ids resolved offline from a cache laid out as huggingface_hub writes it,
and online from a Hub stand-in on loopback (HF_ENDPOINT); start-up that cannot serve exits non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import ModelSpec, Settings
from core.engine import Engine, Registry
from core.errors import ModelUnavailable, StartupFailed
from core.tasks.embed import EmbedRequest
from tests.support.hub import HubStandIn, Repo, folder_files, write_cache
from tests.support.server import ROOT, free_port, running_process

SETTINGS = Settings(threads=2, models=[])
TEXTS = ["A man is eating food.", "The new movie is awesome", "zebra"]


def _variant_files(minilm_dir) -> dict:
    """MiniLM without its Normalize module: other content (unnormalized vectors), so another commit."""
    files = dict(folder_files(minilm_dir))
    modules = [m for m in json.loads((minilm_dir / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    files["modules.json"] = json.dumps(modules).encode()
    return files


@pytest.fixture(scope="session")
def mini_repo(minilm_dir) -> Repo:
    """acme/mini: revision main = the packaged MiniLM's files, tag v2 = the same without Normalize."""
    return Repo.build({"main": folder_files(minilm_dir), "v2": _variant_files(minilm_dir)})


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, mini_repo):
    """An HF_HUB_CACHE holding acme/mini (refs main and v2), as huggingface_hub lays one out."""
    cache = tmp_path_factory.mktemp("hf-home") / "hub"
    write_cache(cache, "acme/mini", mini_repo)
    return cache


@pytest.fixture
def offline(monkeypatch, hub_cache):
    """huggingface_hub offline over ``hub_cache`` (its constants are read at import: patched here)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


@pytest.fixture(scope="session")
def local_vectors(minilm_dir):
    return np.asarray(Engine.load(ModelSpec(path=minilm_dir, backend="torch"), SETTINGS)
                      .run_sync(EmbedRequest(texts=TEXTS)).vectors)


def _vectors(engine: Engine) -> np.ndarray:
    return np.asarray(engine.run_sync(EmbedRequest(texts=TEXTS)).vectors)


# --- (a) offline, from the cache ---------------------------------------------------------------------


def test_a_hub_id_serves_the_cached_snapshot_with_the_same_vectors(offline, mini_repo, local_vectors):
    engine = Engine.load(ModelSpec(path="acme/mini", backend="torch"), SETTINGS)
    assert engine.name == "acme/mini"
    assert engine.model_sha == mini_repo.refs["main"]
    assert engine.spec.path == offline / "models--acme--mini" / "snapshots" / mini_repo.refs["main"]
    got = _vectors(engine)
    assert got.shape == local_vectors.shape == (3, 384)
    assert np.abs(got - local_vectors).max() <= 1e-6


@pytest.mark.parametrize("pin", ["v2", "commit"])
def test_a_revision_pin_serves_that_commit(offline, mini_repo, local_vectors, pin):
    revision = mini_repo.refs["v2"] if pin == "commit" else "v2"
    engine = Engine.load(ModelSpec(path="acme/mini", revision=revision, name="mini-v2", backend="torch"), SETTINGS)
    assert engine.name == "mini-v2"
    assert engine.model_sha == mini_repo.refs["v2"] != mini_repo.refs["main"]
    got = _vectors(engine)
    norms = np.linalg.norm(got, axis=1)
    assert np.all(np.abs(norms - 1) > 0.01)  # v2 has no Normalize module
    assert np.abs(got / norms[:, None] - local_vectors).max() <= 1e-5


@pytest.mark.parametrize("backend", ["onnx", "ct2"])
def test_a_hub_id_of_a_converted_repo_serves_with_that_backend(tmp_path, monkeypatch, request, local_vectors,
                                                               backend):
    """A repository that carries an ONNX graph (onnx/model.onnx, as many Hub repos do) or a CTranslate2
    model, served by its Hub id: the same vectors as the local folder on torch."""
    from huggingface_hub import constants

    folder = request.getfixturevalue("minilm_onnx_dir" if backend == "onnx" else "minilm_ct2_dir")
    cache = tmp_path / "hub"
    write_cache(cache, "acme/mini-converted", Repo.build({"main": folder_files(folder)}))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    engine = Engine.load(ModelSpec(path="acme/mini-converted", backend=backend), SETTINGS)
    assert engine.backend.name == backend and engine.name == "acme/mini-converted"
    diff = float(np.abs(_vectors(engine) - local_vectors).max())
    print(f"\n[parity] hub id {backend}: max abs diff {diff:.2e}")
    assert diff <= 1e-5


@pytest.mark.parametrize("revision", [None, "v9"])
def test_offline_and_not_cached_names_the_id_and_the_download_command(offline, revision):
    path = "acme/absent" if revision is None else "acme/mini"
    with pytest.raises(ModelUnavailable) as info:
        Engine.load(ModelSpec(path=path, revision=revision), SETTINGS)
    message = info.value.message
    assert "\n" not in message and f"{path!r}" in message and "HF_HUB_OFFLINE" in message
    command = f"python -m core download {path}" + (f" --revision {revision}" if revision else "")
    assert f"`{command}`" in message


def test_a_cached_snapshot_without_the_backends_files_says_what_to_fetch(offline):
    with pytest.raises(ModelUnavailable, match=r"no ONNX graph .*`python -m core download acme/mini --backend onnx`"):
        Engine.load(ModelSpec(path="acme/mini", backend="onnx"), SETTINGS)


def test_local_paths_that_are_not_model_folders(tmp_path, minilm_dir):
    with pytest.raises(ModelUnavailable, match="does not exist: it is not a local folder, and not a Hugging Face"):
        Engine.load(ModelSpec(path=tmp_path / "missing" / "model"), SETTINGS)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelUnavailable, match="is a file, not a model folder"):
        Engine.load(ModelSpec(path=tmp_path / "weights.bin"), SETTINGS)
    with pytest.raises(ModelUnavailable, match="'revision' applies to Hugging Face Hub ids"):
        Engine.load(ModelSpec(path=minilm_dir, revision="main"), SETTINGS)


def test_served_names(tmp_path, monkeypatch):
    assert ModelSpec(path="BAAI/bge-small-en-v1.5").served_name == "BAAI/bge-small-en-v1.5"
    assert ModelSpec(path="BAAI/bge-small-en-v1.5", name="bge").served_name == "bge"
    assert ModelSpec(path="/models/bge-small").served_name == "bge-small"
    (tmp_path / "org" / "name").mkdir(parents=True)  # a local folder of that shape wins over the Hub
    monkeypatch.chdir(tmp_path)
    assert ModelSpec(path="org/name").served_name == "name"


def test_model_sha_on_models_and_info(offline, mini_repo, minilm_dir):
    models = [{"path": "acme/mini", "backend": "torch"}, {"path": str(minilm_dir), "name": "local", "backend": "torch"}]
    with TestClient(create_app(Settings(threads=2, models=models))) as client:
        cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
        assert cards["acme/mini"]["model_sha"] == mini_repo.refs["main"]
        assert cards["local"]["model_sha"] is None
        info = client.get("/info", params={"model": "acme/mini"}).json()
        assert info["model_id"] == "acme/mini" and info["model_sha"] == mini_repo.refs["main"]
        assert client.get("/info", params={"model": "local"}).json()["model_sha"] is None


# --- the start-up rule ----------------------------------------------------------------------------


def test_a_failed_model_fails_start_up_unless_degraded_is_allowed(minilm_onnx_dir, tmp_path):
    models = [{"path": str(minilm_onnx_dir), "name": "good"}, {"path": str(tmp_path / "gone"), "name": "gone"}]
    with pytest.raises(StartupFailed, match=r"1 of 2 models failed to load \(gone: model path .* does not exist"):
        with TestClient(create_app(Settings(threads=2, models=models))):
            pass
    with TestClient(create_app(Settings(threads=2, models=models, allow_degraded=True))) as client:
        assert client.post("/v1/embeddings", json={"input": "x", "model": "good"}).status_code == 200
        assert client.post("/v1/embeddings", json={"input": "x", "model": "gone"}).status_code == 503
        ready = client.get("/ready")
        assert ready.status_code == 200 and "failed to load" in ready.json()["models"]["gone"]


def test_no_model_loaded_is_unusable_even_when_degraded(tmp_path):
    registry = Registry.from_settings(Settings(models=[{"path": str(tmp_path / "gone")}], allow_degraded=True))
    assert list(registry.failed) == ["gone"] and not registry.engines
    with pytest.raises(StartupFailed, match="no model could be loaded"):
        registry.raise_if_unusable()


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "HF_", "TRANSFORMERS_OFFLINE"))}
    env.update(PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false", **extra)
    return env


@pytest.mark.parametrize("model, expect", [
    ("/nonexistent/model-folder", "does not exist: it is not a local folder, and not a Hugging Face Hub id"),
    ("acme/absent", "fetch it first with `python -m core download acme/absent`"),
])
def test_serve_exits_non_zero_with_the_reason(tmp_path, model, expect):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "core", "serve", "--model", model, "--host", "127.0.0.1",
                           "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path)))
    assert proc.returncode != 0
    assert time.monotonic() - started < 30
    assert expect in proc.stderr and "Traceback" not in proc.stderr
    assert "error: no model could be loaded" in proc.stderr


# --- (b) online, from a Hub stand-in on loopback ----------------------------------------------------


@pytest.fixture(scope="session")
def hub(minilm_dir, mini_repo):
    decoys = dict(folder_files(minilm_dir))
    decoys.update({"pytorch_model.bin": b"\0" * 4096, "onnx/model.onnx": b"graph", "onnx/model_int8.onnx": b"q",
                   "README.md": b"# decoys"})
    repos = {"acme/mini": mini_repo, "acme/decoys": Repo.build({"main": decoys}),
             "acme/broken": Repo.build({"main": folder_files(minilm_dir)}, missing={"model.safetensors"})}
    with HubStandIn(repos) as stand_in:
        yield stand_in


def _download(hub, home, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core", "download", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=_env(HF_ENDPOINT=hub.endpoint, HF_HOME=str(home)))


@pytest.mark.parametrize("backend, wanted, unwanted", [
    ("torch", {"model.safetensors", "1_Pooling/config.json", "tokenizer.json", "modules.json"},
     {"pytorch_model.bin", "onnx/model.onnx", "onnx/model_int8.onnx", "README.md"}),
    ("onnx", {"onnx/model.onnx", "1_Pooling/config.json", "tokenizer.json"},
     {"model.safetensors", "pytorch_model.bin", "onnx/model_int8.onnx", "README.md"}),
])
def test_download_fetches_only_what_the_backend_reads(hub, tmp_path, backend, wanted, unwanted):
    hub.requests.clear()
    proc = _download(hub, tmp_path, "acme/decoys", "--backend", backend)
    assert proc.returncode == 0, proc.stderr
    commit = hub.repos["acme/decoys"].refs["main"]
    folder = tmp_path / "hub" / "models--acme--decoys" / "snapshots" / commit
    assert proc.stdout.split() == ["acme/decoys", commit, str(folder)]
    fetched = hub.fetched()
    assert wanted <= fetched and not (unwanted & fetched), fetched
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == fetched
    assert (tmp_path / "hub" / "models--acme--decoys" / "refs" / "main").read_text() == commit


@pytest.mark.parametrize("args, expect", [
    (["acme/broken"], "model 'acme/broken': 'model.safetensors', which the Hub lists, could not be downloaded"),
    (["acme/nope"], "no such repository"),
    (["acme/mini", "--revision", "v7"], "revision 'v7' not found"),
])
def test_download_errors_are_one_line(hub, tmp_path, args, expect):
    proc = _download(hub, tmp_path, *args)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expect in errors[0] and "Traceback" not in proc.stderr


def test_serving_hub_ids_from_the_stand_in(hub, mini_repo, tmp_path, local_vectors):
    """A fresh HF_HOME: the server downloads at start, then serves main, the v2 tag and a commit pin."""
    port = free_port()
    models = [{"path": "acme/mini"}, {"path": "acme/mini", "revision": "v2", "name": "mini-v2"},
              {"path": "acme/mini", "revision": mini_repo.refs["v2"], "name": "mini-pinned"}]
    env = _env(HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path), TESSERA_MODELS=json.dumps(models),
               TESSERA_PORT=str(port), TESSERA_THREADS="2")
    with running_process([sys.executable, "-m", "core", "serve"], env, port=port, name="hub-ids") as (base, _):
        cards = {c["id"]: c for c in httpx.get(base + "/v1/models", timeout=10).json()["data"]}
        assert cards["acme/mini"]["model_sha"] == mini_repo.refs["main"]
        assert cards["mini-v2"]["model_sha"] == cards["mini-pinned"]["model_sha"] == mini_repo.refs["v2"]
        assert httpx.get(base + "/info", params={"model": "mini-v2"}, timeout=10).json()["model_sha"] == \
            mini_repo.refs["v2"]

        def embed(name):
            reply = httpx.post(base + "/v1/embeddings", json={"input": TEXTS, "model": name}, timeout=30)
            assert reply.status_code == 200, reply.text
            return np.asarray([d["embedding"] for d in reply.json()["data"]])

        assert np.abs(embed("acme/mini") - local_vectors).max() <= 1e-6
        v2 = embed("mini-v2")
        assert np.abs(np.linalg.norm(v2, axis=1) - 1).min() > 0.01
        assert np.array_equal(v2, embed("mini-pinned"))
    snapshots = tmp_path / "hub" / "models--acme--mini" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == sorted({mini_repo.refs["main"], mini_repo.refs["v2"]})


def test_sagemaker_config_keeps_hub_ids(tmp_path):
    from adapters.sagemaker.models import sagemaker_settings

    (tmp_path / "mini").mkdir()
    (tmp_path / "tessera.yaml").write_text("models:\n  - {path: acme/mini, revision: v2}\n  - {path: mini}\n")
    specs = sagemaker_settings({"SM_MODEL_DIR": str(tmp_path)}).models
    assert [(s.served_name, str(s.path), s.revision) for s in specs] == [
        ("acme/mini", "acme/mini", "v2"), ("mini", str(tmp_path / "mini"), None)]
