"""The Lambda zip package (scripts/build_lambda_zip.py): built once per cache (the dependency wheels for
Python 3.12 / x86_64 come from the package index through pip, and are reused while the pinned requirements
do not change), sized from the zip itself, its model folder served by the handler as the template
configures it, and, where a Python 3.12 is found (python3.12 on PATH or TESSERA_PYTHON312), the package
itself run by that Python under awslambdaric, through a SnapStart init, a snapshot and a restore."""

from __future__ import annotations

import importlib.metadata
import json
import time
import zipfile

import numpy as np
import orjson
import pytest

from benchmarks.lambda_runtime import RuntimeAPI, RuntimeProcess
from tests.adapters.conftest import LAMBDA_HANDLER, reference  # noqa: F401 - reference: a fixture
from tests.adapters.events import function_url_event
from tests.infra.conftest import LAMBDA_TEMPLATE, parse_template
from tests.support.modules import load_script
from tests.support.server import ROOT

pytestmark = pytest.mark.slow

build = load_script("build_lambda_zip")


@pytest.fixture(scope="session")
def python312() -> str | None:
    return build.runtime_python()


@pytest.fixture(scope="session")
def package(request, python312) -> tuple:
    """(tree, zip path): the package built by the script, into the pytest cache."""
    folder = request.config.cache.mkdir("lambda-zip")
    tree, out = folder / "tree", folder / "tessera-lambda.zip"
    options = ["--python", python312] if python312 else []
    assert build.main(["--tree", str(tree), "--out", str(out), "--reuse-deps", *options]) == 0
    return tree, out


@pytest.fixture(scope="session")
def runtime_client(request, python312):
    """awslambdaric (this environment's version) installed for Python 3.12, outside the package, as the
    managed runtime keeps its own."""
    if python312 is None:
        pytest.skip("no Python 3.12 here (python3.12 on PATH, or TESSERA_PYTHON312): the packed wheels are not run")
    version = importlib.metadata.version("awslambdaric")
    folder = request.config.cache.mkdir(f"lambda-ric-{version}-py312")
    if not (folder / "awslambdaric").is_dir():
        build.install_wheels(folder, f"awslambdaric=={version}")
    return folder


def test_unzipped_size_is_within_lambdas_limit(package):
    tree, out = package
    with zipfile.ZipFile(out) as archive:
        entries = archive.infolist()
    unzipped = sum(e.file_size for e in entries)
    assert unzipped == build.unzipped_bytes(tree)  # the zip holds the tree that was sized
    assert 50 * 2**20 < unzipped <= build.UNZIPPED_LIMIT_BYTES == 250 * 2**20


def test_the_zip_holds_the_runtime_the_code_and_the_model(package):
    _, out = package
    with zipfile.ZipFile(out) as archive:
        names = set(archive.namelist())
    assert {"handler.py", "core/__init__.py", "core/engine.py", "model/config.json", "model/tokenizer.json",
            "model/modules.json", "model/onnx/model_int8.onnx"} <= names
    # the wheels of the Lambda runtime's Python and platform, not this machine's
    binaries = [n for n in names if n.endswith(".so")]
    assert any(n.startswith("onnxruntime/capi/onnxruntime_pybind11_state.cpython-312-x86_64-linux-gnu") for n in binaries)
    assert any(n.startswith("numpy/_core/_multiarray_umath.cpython-312-x86_64-linux-gnu") for n in binaries)
    assert any(n.startswith("tokenizers/") and ("abi3" in n or "cpython-312" in n) for n in binaries)
    assert not [n for n in names if "cpython-311" in n]
    tops = {n.split("/")[0] for n in names}
    assert {"mangum", "fastapi", "pydantic_settings", "orjson"} <= tops
    # no torch, no weights other than the served graph; the runtime brings its own client and hooks
    assert not {"torch", "awslambdaric", "snapshot_restore_py.py"} & tops
    assert [n for n in names if n.startswith("model/") and n.endswith((".onnx", ".safetensors", ".bin"))] == [
        "model/onnx/model_int8.onnx"]
    assert (ROOT / "adapters" / "lambda" / "handler.py").read_bytes() == zipfile.ZipFile(out).read("handler.py")


def test_the_packed_model_serves_as_the_template_configures_it(package, reference):
    """The template's TESSERA_MODELS for the zip function, with /var/task replaced by the built tree, served
    by the handler under the runtime client (this Python: the packed wheels are for 3.12)."""
    tree, _ = package
    fn = parse_template(LAMBDA_TEMPLATE)["Resources"]["TesseraZipFunction"]["Properties"]
    models = fn["Environment"]["Variables"]["TESSERA_MODELS"]["Fn::If"][2].replace("/var/task", str(tree))
    texts = ["Le café est très chaud ce matin.", "a packed model"]
    with RuntimeAPI() as api, RuntimeProcess(api, LAMBDA_HANDLER.parent, ROOT, {"TESSERA_MODELS": models}) as proc:
        outcome = api.invoke(function_url_event("POST", "/v1/embeddings", orjson.dumps({"input": texts})), timeout=120)
        assert outcome.kind == "response", proc.stdout + proc.stderr
    assert outcome.body["statusCode"] == 200
    got = np.array([d["embedding"] for d in json.loads(outcome.body["body"])["data"]])
    assert ((got * reference(texts)).sum(axis=1) > 0.97).all()


def test_the_package_carries_the_runtimes_bytecode(package, python312):
    if python312 is None:
        pytest.skip("no Python 3.12 here: the package was built without bytecode")
    _, out = package
    names = zipfile.ZipFile(out).namelist()
    assert "core/__pycache__/engine.cpython-312.pyc" in names and "__pycache__/handler.cpython-312.pyc" in names
    assert "fastapi/__pycache__/applications.cpython-312.pyc" in names
    # hash-based and unchecked (flags 0b01 in the header): used whatever the unpacked sources' timestamps
    header = zipfile.ZipFile(out).read("core/__pycache__/engine.cpython-312.pyc")[4:8]
    assert int.from_bytes(header, "little") == 0b01


def test_the_package_runs_under_python_312_through_a_snap_start_init(package, python312, runtime_client, reference):
    """The built tree as the task root, run by Python 3.12 under awslambdaric with
    AWS_LAMBDA_INITIALIZATION_TYPE=snap-start and no bytecode written (Lambda's task root is read-only): the
    packed model loads and warms up before the snapshot, and after the restore the first invocation is
    answered with the model's vectors."""
    tree, _ = package
    env = {"TESSERA_MODELS": build.models_env(str(tree)), "AWS_LAMBDA_INITIALIZATION_TYPE": "snap-start",
           "PYTHONDONTWRITEBYTECODE": "1"}
    texts = ["Le café est très chaud ce matin.", "served from the zip package"]
    with RuntimeAPI(hold_restore=True) as api, RuntimeProcess(api, tree, None, env, python=python312,
                                                              pythonpath=runtime_client) as proc:
        assert api.wait_snapshot(120), proc.stdout + proc.stderr
        time.sleep(0.2)
        at_snapshot = proc.stdout
        api.restore()
        outcome = api.invoke(function_url_event("POST", "/v1/embeddings", orjson.dumps({"input": texts})), timeout=120)
        assert outcome.kind == "response", proc.stdout + proc.stderr
        version = proc.proc.pid and open(f"/proc/{proc.proc.pid}/cmdline", "rb").read().split(b"\0")[0]
    assert version == python312.encode()
    assert "before snapshot: models" in at_snapshot and "after restore" not in at_snapshot
    assert not api.init_errors and not api.restore_errors
    assert outcome.body["statusCode"] == 200
    got = np.array([d["embedding"] for d in json.loads(outcome.body["body"])["data"]])
    assert ((got * reference(texts)).sum(axis=1) > 0.97).all()
