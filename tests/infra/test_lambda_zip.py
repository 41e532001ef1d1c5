"""The Lambda zip package (scripts/build_lambda_zip.py): built once per cache (the dependency wheels for
Python 3.12 / x86_64 come from the package index through pip, and are reused while the pinned requirements
do not change), sized from the zip itself, and its model folder served by the handler under the runtime
client as the template configures it."""

from __future__ import annotations

import json
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
def package(request) -> tuple:
    """(tree, zip path): the package built by the script, into the pytest cache."""
    folder = request.config.cache.mkdir("lambda-zip")
    tree, out = folder / "tree", folder / "tessera-lambda.zip"
    assert build.main(["--tree", str(tree), "--out", str(out), "--reuse-deps"]) == 0
    return tree, out


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
    assert not [n for n in binaries if "cpython-311" in n]
    tops = {n.split("/")[0] for n in names}
    assert {"mangum", "fastapi", "pydantic_settings", "orjson"} <= tops
    # no torch, no weights other than the served graph; the runtime brings its own client and hooks
    assert not {"torch", "awslambdaric", "snapshot_restore_py.py", "__pycache__"} & tops
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
