"""Modal: the app file imports offline without credentials; the class's enter hooks, web app and bulk
method work locally; the App definition carries the GPU, Volume, scaling and concurrency settings."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np

from tests.adapters.conftest import MODAL_APP, modal_instance
from tests.adapters.contract import MODEL, THREE
from tests.support.server import ROOT

OFFLINE_IMPORT = r"""
import importlib.util, json, os, sys
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("tessera_modal_app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({"app": module.app.name, "cls": type(module.Tessera).__name__,
                  "core_loaded": any(m.startswith("core.") for m in sys.modules),
                  "torch_loaded": "torch" in sys.modules,
                  "credentials": [k for k in os.environ if k.startswith("MODAL_")]}))
"""


def test_imports_offline_without_credentials(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no ~/.modal.toml, no MODAL_TOKEN_*
    done = subprocess.run([sys.executable, "-c", OFFLINE_IMPORT, str(MODAL_APP), str(ROOT)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"app": "tessera", "cls": "Cls", "core_loaded": False, "torch_loaded": False, "credentials": []}


def _definition(module):
    """What Modal will send for the class: read from the objects the decorators built."""
    from modal._utils.async_utils import synchronizer

    function = synchronizer._translate_in(module.Tessera._get_class_service_function())
    load = function._load
    options = {name: cell.cell_contents for name, cell in zip(load.__code__.co_freevars, load.__closure__)}
    hooks = {name: synchronizer._translate_in(pf) for name, pf in module.Tessera._get_partial_functions().items()}
    return function._spec, options, hooks


def test_app_definition_carries_gpu_volume_and_concurrency(modal_module):
    from modal._partial_function import _PartialFunctionFlags as Flags
    from modal_proto import api_pb2

    spec, options, hooks = _definition(modal_module)
    assert spec.gpus == ["L40S", "A100", "L4"]  # from TESSERA_MODAL_GPU, first choice first
    assert list(spec.volumes) == ["/models"]
    assert "tessera-models" in repr(spec.volumes["/models"])
    assert options["gpu"] == ["L40S", "A100", "L4"]
    assert options["max_concurrent_inputs"] == 32  # TESSERA_MODAL_MAX_INPUTS
    assert options["min_containers"] == 1 and options["max_containers"] == 4
    assert options["scaledown_window"] == 300
    assert options["enable_memory_snapshot"] is True
    assert Flags.ENTER_PRE_SNAPSHOT in hooks["import_runtime"].flags
    assert Flags.ENTER_POST_SNAPSHOT in hooks["load"].flags
    assert hooks["web"].params.webhook_config.type == api_pb2.WEBHOOK_TYPE_ASGI_APP
    assert Flags.CALLABLE_INTERFACE in hooks["embed_shard"].flags
    # the container sees the same configuration through its environment
    env = json.loads(json.dumps(modal_module.CONTAINER_ENV))
    assert json.loads(env["TESSERA_MODELS"])[0]["name"] == MODEL
    assert env["TESSERA_MODAL_GPU"] == "L40S,A100,L4"


def test_enter_hooks_build_the_registry_once(modal_module):
    obj, hooks = modal_instance(modal_module)
    assert list(obj.registry.engines) == [MODEL]
    assert obj.registry.engines[MODEL].backend.describe()["backend"] == "onnx"
    app = hooks["web"]._get_raw_f()(obj)
    assert app.state.registry is obj.registry  # the web app serves the registry the enter hook built


def test_bulk_method_matches_the_http_app(modal_module, modal_client):
    obj, hooks = modal_instance(modal_module)
    texts = THREE * 30  # more than one internal chunk of max_batch_size (64)
    vectors = asyncio.run(hooks["embed_shard"]._get_raw_f()(obj, texts))
    assert vectors.shape == (90, 384) and vectors.dtype == np.float32
    over_http = modal_client.post("/v1/embeddings", json={"input": THREE}).json()
    np.testing.assert_allclose(vectors[:3], np.array([d["embedding"] for d in over_http["data"]]), atol=1e-5)


def test_bulk_helpers(modal_module, tmp_path):
    source = tmp_path / "texts.jsonl"
    source.write_text('plain line\n{"text": "json line"}\n\nlast\n', encoding="utf-8")
    texts = modal_module.read_texts(str(source))
    assert texts == ["plain line", "json line", "last"]
    assert modal_module.shards(texts, 2) == [["plain line", "json line"], ["last"]]


def test_seed_volume_fetches_a_hub_model_into_the_volume_cache(modal_module, minilm_dir, tmp_path, monkeypatch):
    """seed_volume --model ID runs `python -m core download` against HF_ENDPOINT (a loopback stand-in here)
    into the Volume's Hugging Face cache, the one the containers serve Hub ids from (HF_HOME)."""
    from modal._utils.async_utils import synchronizer

    from tests.support.hub import HubStandIn, Repo, folder_files

    commits: list = []
    monkeypatch.setattr(modal_module, "HF_HOME", str(tmp_path / "huggingface"))
    monkeypatch.setattr(modal_module, "volume", type("Volume", (), {"commit": lambda self: commits.append(1)})())
    assert modal_module.CONTAINER_ENV["HF_HOME"] == "/models/huggingface"
    repo = Repo.build({"main": folder_files(minilm_dir)})
    seed = synchronizer._translate_in(modal_module.seed_volume)._raw_f
    with HubStandIn({"acme/mini": repo}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("PYTHONPATH", str(ROOT))
        monkeypatch.chdir(ROOT)
        line = seed(model="acme/mini", backend="torch")
    snapshot = tmp_path / "huggingface" / "hub" / "models--acme--mini" / "snapshots" / repo.refs["main"]
    assert line.split() == ["acme/mini", repo.refs["main"], str(snapshot)] and commits == [1]
    assert (snapshot / "model.safetensors").stat().st_size == (minilm_dir / "model.safetensors").stat().st_size
