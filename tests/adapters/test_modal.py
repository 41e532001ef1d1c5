"""Modal, with the real ``modal`` package: the app file imports offline without credentials; the enter
hooks run in Modal's snapshot phases (found by Modal's own lookup) and the snapshot phase leaves torch
and the weights in memory; no API key reaches the image or the app's definition; the web app and the
bulk method work locally; the App definition carries the GPU, Volume, secret, scaling and concurrency
settings."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np

import pytest

from tests.adapters.conftest import (MODAL_APP, MODAL_ENV, modal_env, modal_instance, modal_restore_phase,
                                     modal_snapshot_phase)
from tests.adapters.contract import MODEL, THREE
from tests.support.modules import load_by_path
from tests.support.server import ROOT, environ_without_settings

OFFLINE_IMPORT = r"""
import importlib.util, json, os, sys
spec = importlib.util.spec_from_file_location("tessera_modal_app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({"app": module.app.name, "cls": type(module.Tessera).__name__,
                  "core_loaded": sorted(m for m in sys.modules if m == "core" or m.startswith("core.")),
                  "torch_loaded": "torch" in sys.modules,
                  "credentials": [k for k in os.environ if k.startswith("MODAL_")]}))
"""


def test_imports_offline_without_credentials(tmp_path):
    # no ~/.modal.toml, no MODAL_TOKEN_*
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", OFFLINE_IMPORT, str(MODAL_APP)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # only the front-end planner and the device rules it applies (the standard library alone), which pick the web
    # decorator at import
    assert result == {"app": "tessera", "cls": "Cls", "core_loaded": ["core", "core.devices", "core.frontends"],
                      "torch_loaded": False, "credentials": []}


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
    # the autoscaler's target: a new container starts at 24 busy slots, not when all 32 are taken
    assert options["target_concurrent_inputs_int"] == 24
    assert options["min_containers"] == 1 and options["max_containers"] == 4
    assert options["scaledown_window"] == 300
    assert options["enable_memory_snapshot"] is True
    assert Flags.ENTER_PRE_SNAPSHOT in hooks["load_weights"].flags
    assert Flags.ENTER_POST_SNAPSHOT in hooks["load"].flags
    assert hooks["web"].params.webhook_config.type == api_pb2.WEBHOOK_TYPE_ASGI_APP
    assert hooks["web"].params.webhook_config.requires_proxy_auth is False  # TESSERA_MODAL_PROXY_AUTH unset
    assert Flags.CALLABLE_INTERFACE in hooks["embed_shard"].flags
    assert Flags.CALLABLE_INTERFACE in hooks["describe_model"].flags
    # the container sees the same configuration through its environment
    env = json.loads(json.dumps(modal_module.DEPLOY.container_env()))
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


def test_bulk_shards_queue_on_the_models_batcher(modal_module):
    """Concurrent ``embed_shard`` calls go through the model's batcher, as web requests do, so they share its
    token budget and batch-size cap: no shard runs the model on its own."""
    obj, hooks = modal_instance(modal_module)
    embed = hooks["embed_shard"]._get_raw_f()
    batcher = obj.registry.engines[MODEL].batcher
    queued: list[int] = []
    submit = batcher.submit

    async def counted(items, **kwargs):
        queued.append(len(items))
        return await submit(items, **kwargs)

    batcher.submit = counted
    texts = [f"{text} ({i})" for i, text in enumerate(THREE * 40)]
    shards = [texts[i:i + 10] for i in range(0, len(texts), 10)]

    async def calls():
        return await asyncio.gather(*(embed(obj, shard) for shard in shards))

    parts = asyncio.run(calls())
    assert [len(p) for p in parts] == [len(s) for s in shards]
    assert sum(queued) == len(texts) and len(queued) == len(shards)  # every text was queued on the batcher


def local_map(obj, hooks):
    """``Tessera().embed_shard.map(shards, kwargs=..., order_outputs=True)`` as Modal runs it, one container:
    the class's own method on each shard, results in order; and ``describe_model.remote``."""
    embed, describe = hooks["embed_shard"]._get_raw_f(), hooks["describe_model"]._get_raw_f()
    calls: list[int] = []
    loop = asyncio.new_event_loop()  # the container's one event loop (the batchers live in it)

    def embed_map(shards, kwargs):
        for shard in shards:
            calls.append(len(shard))
            yield loop.run_until_complete(embed(obj, shard, None, kwargs))

    return embed_map, (lambda: loop.run_until_complete(describe(obj, None))), calls, loop


def test_bulk_job_on_the_class_writes_the_local_jobs_parquet_and_resumes(modal_module, modal_client, tmp_path):
    """``bulk`` (and ``python -m core embed --on modal``): ids and vectors as the HTTP app gives them, repeats
    sent once, the model's identity from the class, and an interrupted job resumed without redoing its parts."""
    import pyarrow.parquet as pq

    from core.bulk.job import JobOptions
    from core.bulk.modal_runner import run_modal_job
    from core.config import Settings

    obj, hooks = modal_instance(modal_module)
    distinct = [f"{THREE[j % 3]} ({j})" for j in range(50)]
    texts = [distinct[i % 50] for i in range(120)]  # 120 rows, 50 distinct texts
    source = tmp_path / "corpus.jsonl"
    source.write_text("".join(json.dumps({"text": t, "key": f"k{i}"}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "vectors.parquet"
    options = JobOptions(input=str(source), output=str(out), id_column="key", rows_per_part=20)
    embed_map, describe, calls, loop = local_map(obj, hooks)

    windows = []

    def failing_map(shards, kwargs):  # the connection to the app is lost in the third window (of 20 rows)
        windows.append(len(shards))
        if len(windows) == 3:
            raise RuntimeError("connection lost")
        yield from embed_map(shards, kwargs)

    with pytest.raises(RuntimeError, match="connection lost"):
        run_modal_job(Settings(), options, failing_map, describe, shard_size=8, window=1)
    assert sum(calls) == 40 and (tmp_path / "vectors.parquet.parts").is_dir()
    summary = run_modal_job(Settings(), options, embed_map, describe, shard_size=8, window=2)
    assert summary.resumed_from == 40 and summary.rows == 120 and summary.rows_this_run == 80
    assert sum(calls) == 50  # each distinct text sent once over both runs
    assert max(calls) <= 8
    table = pq.read_table(out)
    assert table.column("key").to_pylist() == [f"k{i}" for i in range(120)]
    vectors = np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(120, -1)
    over_http = modal_client.post("/v1/embeddings", json={"input": texts[:6]}).json()
    np.testing.assert_allclose(vectors[:6], np.array([d["embedding"] for d in over_http["data"]]), atol=1e-5)
    meta = json.loads(table.schema.metadata[b"tessera"])
    assert meta["model"]["name"] == MODEL and len(meta["model"]["identity"]) == 32
    # vector options reach the class: quantized, Matryoshka
    small = tmp_path / "small.parquet"
    run_modal_job(Settings(), JobOptions(input=str(source), output=str(small), dimensions=32, embedding_type="int8"),
                  embed_map, describe)
    assert str(pq.read_schema(small).field("embedding").type) == "fixed_size_list<element: int8>[32]"
    loop.run_until_complete(obj.registry.stop())  # the container's end: its batchers stop in their loop
    loop.close()


# --- memory snapshot: what the snapshot phase leaves in memory ----------------------------------

SNAPSHOT_PHASES = r"""
import asyncio, json, sys
from tests.adapters.conftest import modal_hooks
from tests.support.modules import load_by_path

report = {}
module = load_by_path("tessera_modal_app", __import__("pathlib").Path(sys.argv[1]))
report["torch_after_import"] = "torch" in sys.modules
obj = module.Tessera._get_user_cls()()
cuda_calls = []
QUERIES = {"is_available", "device_count", "_lazy_init", "init", "current_device", "get_device_properties",
           "set_device", "_device_count_nvml", "is_bf16_supported"}

def watch(frame, event, arg):  # torch.cuda's queries (torch caches "no GPU" once asked) while the hook runs
    code = frame.f_code
    if event == "call" and code.co_name in QUERIES and "/torch/cuda/" in code.co_filename:
        cuda_calls.append(code.co_name)

sys.setprofile(watch)
for hook in modal_hooks(obj, "snapshot"):
    hook()
sys.setprofile(None)
report["torch_after_snapshot"] = "torch" in sys.modules

import torch
report["cuda_initialized"] = torch.cuda.is_initialized()
report["cuda_calls"] = cuda_calls
staged = obj.snapshot_registry
report["snapshot_engines"] = sorted(staged.engines)
report["snapshot_failed"] = sorted(staged.failed)
model = staged.engines["minilm-torch"].backend._eager
report["snapshot_params"] = sorted({f"{p.device.type}/{p.dtype}" for p in model.parameters()})
report["snapshot_param_count"] = sum(p.numel() for p in model.parameters())

# after restore: a GPU would be attached; this machine has only its CPU, so the move is recorded with
# the spec's device and dtype, then made to the device the machine has
from core.backends.torch import TorchBackend
moves, move = [], TorchBackend.to_device
def to_device(self, device, dtype=None):
    moves.append([device, dtype])
    move(self, "cpu", "float32")
TorchBackend.to_device = to_device
try:
    for hook in modal_hooks(obj, "restore"):
        hook()
except __import__("core.errors").errors.StartupFailed as exc:  # the ONNX model cannot load on cuda here: the start fails, naming it
    report["restore_error"] = str(exc)
report["moves"] = moves
engine = obj.registry.engines["minilm-torch"]
report["same_weights"] = engine.backend._eager is model
report["served_spec"] = [engine.spec.device, engine.spec.dtype, engine.batcher.max_batch_tokens
                         if hasattr(engine.batcher, "max_batch_tokens") else engine.spec.batch_tokens]
report["restore_engines"] = sorted(obj.registry.engines)
report["restore_failed"] = sorted(obj.registry.failed)

texts = ["A man is eating food.", "A man is riding a horse.", "Un homme mange."]
vectors = asyncio.run(module.Tessera._get_partial_functions()["embed_shard"]._get_raw_f()(obj, texts, "minilm-torch"))

from core.config import ModelSpec, Settings
from core.engine import Registry
from core.inprocess import AsyncModels
settings = Settings(models=[ModelSpec(path=sys.argv[2], name="ref", backend="torch")])
reference = asyncio.run(AsyncModels(settings, Registry.from_settings(settings)).embed(texts, "ref"))
report["shape"] = list(vectors.shape)
report["max_abs_diff"] = float(abs(vectors - reference).max())
print(json.dumps(report))
"""


def test_snapshot_phase_leaves_torch_and_the_weights_in_memory(minilm_dir, packaged_int8_onnx, tmp_path):
    """Run the app's enter hooks in a fresh process, phase by phase, with a torch model on cuda/float16
    and an ONNX model on cuda: after the snapshot phase torch is imported and the torch model's weights
    are loaded on the CPU without a single CUDA query; after restore they are moved (to the spec's
    device) and serve; the ONNX model loads only after restore."""
    models = [{"path": str(minilm_dir), "name": "minilm-torch", "backend": "torch", "device": "cuda",
               "dtype": "float16"},
              {"path": str(minilm_dir), "name": "minilm-onnx", "backend": "onnx", "device": "cuda",
               "dtype": "int8", "onnx_file": str(packaged_int8_onnx)}]
    env = environ_without_settings()
    env.update({"TESSERA_MODELS": json.dumps(models), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-c", SNAPSHOT_PHASES, str(MODAL_APP), str(minilm_dir)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch_after_import"] is False  # importing the app file stays light
    assert report["torch_after_snapshot"] is True
    assert report["cuda_initialized"] is False and report["cuda_calls"] == []
    assert report["snapshot_engines"] == ["minilm-torch"] and report["snapshot_failed"] == []
    # float16 runs on CUDA only: staged as float32 on the CPU, every MiniLM parameter loaded
    assert report["snapshot_params"] == ["cpu/torch.float32"]
    assert report["snapshot_param_count"] > 22_000_000
    assert report["moves"] == [["cuda", "float16"]]  # the spec's device and dtype
    assert report["same_weights"] is True  # the snapshot's weights, moved: not loaded again
    assert report["served_spec"][:2] == ["cuda", "float16"]
    assert report["served_spec"][2] == 16384  # the accelerator's batch budget, not the CPU's 512
    # the ONNX model on cuda was left for after restore, and tried there: no CUDA provider here, so it
    # fails, and that fails the container's start (Modal has no health check to hold it back)
    assert report["restore_engines"] == ["minilm-torch"] and report["restore_failed"] == ["minilm-onnx"]
    assert report["restore_error"].startswith("1 of 2 models failed to load (minilm-onnx: ")
    assert report["shape"] == [3, 384] and report["max_abs_diff"] < 1e-5


def test_torch_to_device_applies_the_load_rules(minilm_dir):
    import torch

    from core.backends.onnx import OnnxBackend
    from core.backends.torch import TorchBackend
    from core.errors import InvalidInput, Unsupported

    with pytest.raises(Unsupported, match="load it on that device"):
        OnnxBackend.from_spec(__import__("core.config", fromlist=["ModelSpec"]).ModelSpec(path=minilm_dir)).to_device("cuda")
    backend = TorchBackend()
    backend.load(minilm_dir, head="encoder", device="cpu", dtype="float32", threads=1)
    if not torch.cuda.is_available():
        with pytest.raises(InvalidInput, match="CUDA is not available"):
            backend.to_device("cuda", "float16")
    with pytest.raises(InvalidInput, match="float16 on CPU"):
        backend.to_device("cpu", "float16")
    with pytest.raises(InvalidInput, match="cannot convert a loaded float32 model to int8"):
        backend.to_device("cpu", "int8")
    ids = np.array([[101, 7592, 2088, 102]], np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    before = backend.run(inputs)["last_hidden_state"]
    backend.to_device("cpu", "bfloat16")
    assert {p.dtype for p in backend._model.parameters()} == {torch.bfloat16}
    assert backend.describe()["dtype"] == "bfloat16"
    after = backend.run(inputs)["last_hidden_state"]
    assert np.abs(after - before).max() < 0.1  # the same model, in bfloat16
    int8 = TorchBackend()
    int8.load(minilm_dir, head="encoder", device="cpu", dtype="int8", threads=1)
    with pytest.raises(InvalidInput, match="int8 .* CPU only"):
        int8.to_device("cuda:0")


# --- secrets: never in the image, never in the app's definition -------------------------------

DEPLOY_KEY = "sk-deploy-time-4f2a9c"


def _closure(function) -> dict:
    return {name: cell.cell_contents for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ())}


def image_definition(image) -> tuple[list[str], list]:
    """Every Dockerfile command of every layer of ``image`` (as Modal's builder renders them for each
    builder version) and every secret a build step gets, walking the layers through their base images."""
    from modal._image import _Image, ImageBuilderVersion
    from modal._utils.async_utils import synchronizer

    versions = ImageBuilderVersion.__args__
    commands, secrets, todo, seen = [], [], [synchronizer._translate_in(image)], set()
    while todo:
        layer = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        closure = _closure(layer._load)
        if closure.get("dockerfile_function") is not None:
            for version in versions:
                commands += closure["dockerfile_function"](version).commands
        secrets += list(closure.get("secrets") or ())
        todo += [dep for dep in layer._deps() if isinstance(dep, _Image)]
    return commands, secrets


@pytest.fixture(scope="module")
def modal_with_secret(modal_module):
    """The app file loaded as an operator deploys it with keys in a Modal Secret, proxy auth on, a
    target of 20 inputs, and API keys also lying in the deploy-time environment."""
    extra = {"TESSERA_MODAL_SECRET": "tessera-keys", "TESSERA_MODAL_PROXY_AUTH": "1",
             "TESSERA_MODAL_TARGET_INPUTS": "20", "TESSERA_API_KEYS": json.dumps([DEPLOY_KEY])}
    MODAL_ENV.update(extra)
    try:
        with modal_env():
            module = load_by_path("tessera_modal_app_with_secret", MODAL_APP)
    finally:
        for key in extra:
            MODAL_ENV.pop(key)
    return module


def test_no_api_key_in_the_image_or_the_definition(modal_with_secret):
    from modal._utils.async_utils import synchronizer

    commands, build_secrets = image_definition(modal_with_secret.image)
    assert any("torch==2.13.0" in c for c in commands)  # the walk reaches the pip layer
    assert not [c for c in commands if DEPLOY_KEY in c or "TESSERA_API_KEYS" in c]
    assert build_secrets == []
    spec, options, hooks = _definition(modal_with_secret)
    secrets = [synchronizer._translate_in(s) for s in spec.secrets]
    assert "modal.Secret.from_name('tessera-keys')" in [repr(s) for s in secrets]
    # the class's env= becomes a from_dict secret holding the plain settings, and no key
    sent = [s._load_env_dict() for s in secrets if getattr(s, "_load_env_dict", None) is not None]
    assert len(sent) == 1 and "TESSERA_MODELS" in sent[0]
    assert "TESSERA_API_KEYS" not in sent[0] and DEPLOY_KEY not in json.dumps(sent[0])
    assert DEPLOY_KEY not in json.dumps(modal_with_secret.DEPLOY.container_env())
    assert hooks["web"].params.webhook_config.requires_proxy_auth is True
    assert options["target_concurrent_inputs_int"] == 20 and options["max_concurrent_inputs"] == 32


def test_deploy_time_keys_without_a_secret_are_refused(modal_module):
    MODAL_ENV["TESSERA_API_KEYS"] = json.dumps([DEPLOY_KEY])
    try:
        with modal_env(), pytest.raises(RuntimeError, match="modal secret create") as raised:
            load_by_path("tessera_modal_app_keys_in_env", MODAL_APP)
    finally:
        MODAL_ENV.pop("TESSERA_API_KEYS")
    assert DEPLOY_KEY not in str(raised.value)


SETTINGS_ALONE = r"""
import importlib.abc, json, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("modal", "core"):
            raise ImportError(f"{name} is blocked in this process")
        return None

sys.meta_path.insert(0, Block())
from adapters.modal.settings import deploy_time_keys_problem, modal_settings

defaults = modal_settings({})
given = modal_settings({"TESSERA_MODAL_GPU": " A10G, ,L4 ", "TESSERA_MODAL_MAX_INPUTS": "10",
                        "TESSERA_MODAL_SNAPSHOT": "0", "TESSERA_MODAL_PROXY_AUTH": "1",
                        "TESSERA_MODAL_FRONTENDS": "3", "TESSERA_MODAL_CPU": "8.5"})
refusals = []
for bad in ({"TESSERA_MODAL_FRONTENDS": "0"}, {"TESSERA_MODAL_FRONTENDS": "many"}, {"TESSERA_MODAL_CPU": "0"}):
    try:
        modal_settings(bad)
    except ValueError as exc:
        refusals.append(str(exc))
print(json.dumps({"defaults": [defaults.app_name, defaults.gpus, defaults.limits(1), defaults.limits(3),
                               defaults.limits(40), defaults.frontends, defaults.cpu, defaults.planning_cpus,
                               defaults.port, defaults.snapshot, defaults.proxy_auth,
                               json.loads(defaults.models)[0]["path"]],
                  "given": [given.gpus, given.limits(1), given.limits(3), given.frontends, given.cpu,
                            given.planning_cpus, given.snapshot, given.proxy_auth],
                  "refusals": refusals,
                  "refused": deploy_time_keys_problem({"TESSERA_API_KEYS": '["sk-1"]'}),
                  "with_secret": deploy_time_keys_problem({"TESSERA_API_KEYS": '["sk-1"]',
                                                           "TESSERA_MODAL_SECRET": "tessera-keys"}),
                  "none": deploy_time_keys_problem({})}))
"""


def test_deploy_settings_and_the_key_check_import_without_modal_or_core(tmp_path):
    """adapters/modal/settings.py (what scripts/deploy.py loads for its dry run) needs neither package."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SETTINGS_ALONE], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # no cap set: 64 inputs per front end (at most Modal's 1,000), the target 3/4 of it
    assert result["defaults"] == ["tessera", ["L4", "A10G", "T4"], [64, 48], [192, 144], [1000, 750], "auto", None, 1,
                                  8000, True, False, "/models/all-MiniLM-L6-v2"]
    # a cap set is the container's, whatever the front ends; the target: 3/4 of it
    assert result["given"] == [["A10G", "L4"], [10, 7], [10, 7], 3, 8.5, 8, False, True]
    assert [r.split(":")[0] for r in result["refusals"]] == [
        "TESSERA_MODAL_FRONTENDS='0'", "TESSERA_MODAL_FRONTENDS='many'", "TESSERA_MODAL_CPU='0'"]
    assert "put them in a Modal Secret" in result["refused"] and "sk-1" not in result["refused"]
    assert result["with_secret"] is None and result["none"] is None


def test_the_image_ships_what_the_app_file_imports(modal_module, tmp_path):
    """A container imports the app file with only the image's local sources beside it: the files the
    image's mounts put under /root, laid out in a folder, are enough to import it (outside the checkout)."""
    import shutil

    from modal._utils.async_utils import synchronizer
    from modal.mount import _Mount

    image = synchronizer._translate_in(modal_module.image)
    todo, mounts = [image], []
    while todo:  # the mount layers sit in the image's dependencies
        for dep in todo.pop()._deps():
            (mounts if isinstance(dep, _Mount) else todo).append(dep)
    root = tmp_path / "root"
    for mount in mounts:
        for entry in mount._entries:
            for local, remote in entry.get_files_to_upload():
                target = root / str(remote).removeprefix("/root/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local, target)
    assert (root / "adapters" / "modal" / "settings.py").is_file() and (root / "core" / "engine.py").is_file()
    shutil.copyfile(MODAL_APP, root / "app.py")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", "import app; print(app.app.name)"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "tessera"


def test_a_rotated_key_is_read_after_restore(modal_module):
    """The Secret's value read by the restore hook, not frozen in the snapshot: Modal updates the
    environment when it restores a container."""
    from starlette.testclient import TestClient

    MODAL_ENV["TESSERA_API_KEYS"] = json.dumps(["sk-before-snapshot"])
    try:
        obj = modal_snapshot_phase(modal_module)
        MODAL_ENV["TESSERA_API_KEYS"] = json.dumps(["sk-after-restore"])
        modal_restore_phase(obj)
    finally:
        MODAL_ENV.pop("TESSERA_API_KEYS")
    app = modal_module.Tessera._get_partial_functions()["web"]._get_raw_f()(obj)
    with TestClient(app) as client:
        def status(key):
            return client.post("/v1/embeddings", json={"input": "hi"}, headers={"Authorization": f"Bearer {key}"}).status_code
        assert status("sk-after-restore") == 200
        assert status("sk-before-snapshot") == 401


def test_weights_volume_is_v2(modal_module):
    from modal._utils.async_utils import synchronizer

    spec, _, _ = _definition(modal_module)
    volume = synchronizer._translate_in(spec.volumes["/models"])
    assert repr(volume) == "modal.Volume.from_name('tessera-models')"
    assert _closure(volume._load)["version"] == 2  # TESSERA_MODAL_VOLUME_VERSION's default


# --- bulk: .map over shards into one file ---------------------------------------------------------

def test_bulk_maps_with_ordered_outputs(modal_module):
    """``bulk`` asks Modal's map for outputs in input order (what the job's part writer relies on)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(modal_module._bulk))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "map"]
    assert len(calls) == 1
    keywords = {k.arg: k.value for k in calls[0].keywords}
    assert isinstance(keywords["order_outputs"], ast.Constant) and keywords["order_outputs"].value is True


def test_bulk_refuses_an_output_that_is_its_input_in_one_line(modal_module, tmp_path, capsys):
    """``modal run app.py::bulk`` with the corpus as its own output: refused before anything runs, as
    ``python -m core embed`` refuses it (one ``error:`` line, exit status 1, the corpus untouched)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), corpus)
    before = corpus.read_bytes()
    with pytest.raises(SystemExit) as stopped:
        modal_module.bulk.info.raw_f(input=str(corpus), output=f"{tmp_path}/./../{tmp_path.name}/in.parquet")
    assert stopped.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --output ") and "is the input file" in err[0], err
    assert corpus.read_bytes() == before


def test_a_model_that_cannot_load_fails_the_start(modal_module, tmp_path):
    """Before the snapshot: no snapshot is taken of a container that cannot serve its models."""
    saved = MODAL_ENV["TESSERA_MODELS"]
    MODAL_ENV["TESSERA_MODELS"] = json.dumps([{"path": str(tmp_path / "missing"), "name": "gone"}])
    try:
        from core.errors import StartupFailed

        with pytest.raises(StartupFailed, match=r"no model could be loaded \(gone: "):
            modal_snapshot_phase(modal_module)
    finally:
        MODAL_ENV["TESSERA_MODELS"] = saved


def test_seed_volume_fetches_a_hub_model_into_the_volume_cache(modal_module, minilm_dir, tmp_path, monkeypatch):
    """seed_volume --model ID runs `python -m core download` against HF_ENDPOINT (a loopback stand-in here)
    into the Volume's Hugging Face cache, the one the containers serve Hub ids from (HF_HOME)."""
    from modal._utils.async_utils import synchronizer

    from tests.support.hub import HubStandIn, Repo, folder_files

    commits: list = []
    monkeypatch.setattr(modal_module, "HF_HOME", str(tmp_path / "huggingface"))
    monkeypatch.setattr(modal_module, "volume", type("Volume", (), {"commit": lambda self: commits.append(1)})())
    assert modal_module.DEPLOY.container_env()["HF_HOME"] == "/models/huggingface"
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


# --- the host's NVIDIA driver against torch's CUDA build, checked when the GPU is attached --------------------
# torch 2.13's CUDA 13 build needs driver branch 580 or newer (NVIDIA, CUDA Toolkit release notes; forward
# compatibility would need NVIDIA's compat libraries, which this image does not carry). Modal manages its
# hosts' driver and its current docs read here state no version; so the restore hook (GPU attached) checks,
# with the rules core/cuda_driver.py shares with the SageMaker CUDA image. torch here is a CPU build: its
# torch.version.cuda is set to "13.0" to stand in for the image's CUDA 13 build.

def _driver_file(tmp_path, version: str):
    path = tmp_path / f"nvidia-{version}"
    path.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Release Build\n")
    return path


@pytest.mark.parametrize("driver, refused", [("575.57.08", True), ("535.247.01", True), ("580.95.05", False)])
def test_restore_checks_the_driver_against_the_cuda_build(modal_module, minilm_dir, tmp_path, monkeypatch,
                                                          caplog, driver, refused):
    import logging

    import torch

    from core.backends.torch import TorchBackend
    from core.errors import StartupFailed

    spec = {"path": str(minilm_dir), "name": "minilm-cuda", "backend": "torch", "device": "cuda", "dtype": "float16"}
    saved = dict(MODAL_ENV)
    MODAL_ENV.update({"TESSERA_MODELS": json.dumps([spec]),
                      "TESSERA_NVIDIA_VERSION_FILE": str(_driver_file(tmp_path, driver))})
    moves = []
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(TorchBackend, "to_device", lambda self, device, dtype=None: moves.append(device))
    caplog.set_level(logging.INFO, logger="tessera.modal")
    try:
        obj = modal_snapshot_phase(modal_module)
        shown = ".".join(str(int(p)) for p in driver.split("."))
        if refused:
            with pytest.raises(StartupFailed) as failed:
                modal_restore_phase(obj)
            message = failed.value.message
            assert f"NVIDIA driver {shown}, torch CUDA build 13.0: refused" in message
            assert "Fix: Modal manages" in message and "download.pytorch.org/whl/cu128" in message
            assert moves == []  # failed at once, before any model moved to the GPU
        else:
            modal_restore_phase(obj)
            assert moves == ["cuda"]
        assert f"NVIDIA driver {shown}, torch CUDA build 13.0: {'refused' if refused else 'natively'}" in caplog.text
    finally:
        MODAL_ENV.clear()
        MODAL_ENV.update(saved)


# --- memory snapshot vs the Volume: the weights' identity, checked after restore; fresh random state -----------
# Modal's memory-snapshot guide: changes to a Volume after a snapshot are not reflected in it (and deleting
# files it referenced breaks restores). A model re-seeded in place under the same spec must not keep serving
# the snapshot's weights.

def _model_copy(minilm_dir, target):
    target.mkdir()
    for item in minilm_dir.iterdir():
        if item.name == "model.safetensors":
            import shutil

            shutil.copy(item, target / item.name)
        else:
            (target / item.name).symlink_to(item)
    return target


def _embed(module, obj, texts, name):
    return asyncio.run(module.Tessera._get_partial_functions()["embed_shard"]._get_raw_f()(obj, texts, name))


def test_a_model_reseeded_on_the_volume_after_the_snapshot_is_loaded_again(modal_module, minilm_dir, tmp_path):
    import os

    from safetensors.torch import load_file, save_file

    from core.config import ModelSpec, Settings
    from core.engine import Registry
    from core.inprocess import AsyncModels

    folder = _model_copy(minilm_dir, tmp_path / "model")
    spec = {"path": str(folder), "name": "reseeded", "backend": "torch", "device": "cpu"}
    texts = ["A man is eating food.", "Un homme mange."]
    saved = dict(MODAL_ENV)
    MODAL_ENV.update({"TESSERA_MODELS": json.dumps([spec])})
    try:
        unchanged = modal_snapshot_phase(modal_module)
        kept = unchanged.snapshot_registry.engines["reseeded"].backend
        modal_restore_phase(unchanged)  # the Volume as it was: the snapshot's weights are served
        assert unchanged.registry.engines["reseeded"].backend is kept

        obj = modal_snapshot_phase(modal_module)
        stale = obj.snapshot_registry.engines["reseeded"].backend
        # the model is re-seeded in place (same path, same spec) after the snapshot was taken
        state = load_file(str(folder / "model.safetensors"))
        state = {k: (v * 0.5 if v.is_floating_point() and v.dim() == 2 else v) for k, v in state.items()}
        save_file(state, str(tmp_path / "new.safetensors"), metadata={"format": "pt"})
        os.replace(tmp_path / "new.safetensors", folder / "model.safetensors")
        modal_restore_phase(obj)
        assert obj.registry.engines["reseeded"].backend is not stale
        served = _embed(modal_module, obj, texts, "reseeded")
    finally:
        MODAL_ENV.clear()
        MODAL_ENV.update(saved)
    settings = Settings(models=[ModelSpec(path=folder, name="ref", backend="torch")])
    reference = asyncio.run(AsyncModels(settings, Registry.from_settings(settings)).embed(texts, "ref"))
    assert float(abs(served - reference).max()) < 1e-5  # the Volume's weights now, not the snapshot's
    original = Settings(models=[ModelSpec(path=minilm_dir, name="orig", backend="torch")])
    first = asyncio.run(AsyncModels(original, Registry.from_settings(original)).embed(texts, "orig"))
    assert float(abs(served - first).max()) > 1e-3


def test_restore_reseeds_the_random_generators(modal_module):
    """Every container restored from one snapshot starts with the snapshot's generator state: the restore
    hook draws fresh seeds (random, numpy, torch), as the Lambda adapter's after-restore hook does."""
    import random

    import numpy
    import torch

    obj = modal_snapshot_phase(modal_module)
    random.seed(1234)
    numpy.random.seed(1234)
    torch.manual_seed(1234)
    same = (random.Random(1234).random(), numpy.random.RandomState(1234).random_sample(),
            float(torch.rand(1, generator=torch.Generator().manual_seed(1234))))
    modal_restore_phase(obj)
    assert random.random() != same[0]
    assert numpy.random.random_sample() != same[1]
    assert float(torch.rand(1)) != same[2]


SNAPSHOT_SETTING = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("tessera_modal_app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)  # modal checks the hooks against enable_memory_snapshot here, as at deploy
from modal._partial_function import _PartialFunctionFlags as Flags
from modal._utils.async_utils import synchronizer
hooks = {name: synchronizer._translate_in(pf) for name, pf in module.Tessera._get_partial_functions().items()}
print(json.dumps({name: [Flags.ENTER_PRE_SNAPSHOT in hooks[name].flags, Flags.ENTER_POST_SNAPSHOT in hooks[name].flags]
                  for name in ("load_weights", "load")}))
"""


@pytest.mark.parametrize("snapshot", ["1", "0"])
def test_the_app_defines_its_class_with_the_snapshot_on_and_off(snapshot, tmp_path):
    """``TESSERA_MODAL_SNAPSHOT=0`` deploys: modal refuses ``@modal.enter(snap=True)`` on a class without
    ``enable_memory_snapshot=True`` when the class is defined ("A class must have `enable_memory_snapshot=True`
    to use `snap=True` on its methods", modal-client ``py/modal/app.py``), so the pre-snapshot hook is a
    pre-snapshot hook only with the snapshot on; off, both hooks run after start, in the same order. Each value in
    a fresh interpreter, as ``modal deploy`` imports the file."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
           "TESSERA_MODAL_SNAPSHOT": snapshot}
    done = subprocess.run([sys.executable, "-c", SNAPSHOT_SETTING, str(MODAL_APP)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    flags = json.loads(done.stdout.strip().splitlines()[-1])
    on = snapshot == "1"
    assert flags == {"load_weights": [on, not on], "load": [False, True]}
