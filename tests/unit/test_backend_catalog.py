"""A new backend is one module plus one line of the catalog: run in a fresh process that adds the line
(``tests/support/extra_backend.py``, OpenVINO-shaped) before anything reads the catalog."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.server import ROOT

PROGRAM = r"""
import json, sys
from pathlib import Path
import core.backends.catalog as catalog
catalog.BACKENDS["openvino"] = "tests.support.extra_backend:ExtraBackend"   # the one line

from core.backends.registry import choose, create_backend
from core.cli import build_parser
from core.config import ModelSpec
from core.errors import MissingDependency
from core.hub import select_files

def serve_help():
    import contextlib, io
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return out.getvalue()

folder = Path(sys.argv[1])
for name in ("config.json", "tokenizer.json", "model.safetensors", "openvino/openvino_model.xml",
             "openvino/openvino_model.bin"):
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("{}")
listing = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()] + ["onnx/model.onnx"]
spec = ModelSpec(path=folder, device="cpu", openvino={"performance_hint": "THROUGHPUT"})
auto = choose(ModelSpec(path=folder, device="cpu"), auto_export=False)
backend = create_backend(spec, choose(spec.model_copy(update={"backend": "openvino"})))
try:
    backend.load(folder, head="encoder", device="cpu", dtype="float32", threads=1)
    missing = None
except MissingDependency as exc:
    missing = exc.message
print(json.dumps({
    "names": catalog.names(),
    "spec_field": "openvino" in ModelSpec.model_fields,
    "hint": backend.hint,
    "auto": [auto.backend, auto.reason],
    "hub_openvino": select_files(listing, backend="openvino"),
    "hub_auto": select_files(listing, backend="auto"),
    "cli": serve_help(),
    "missing": missing,
}))
"""


def test_a_backend_is_one_module_and_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["names"] == ["torch", "onnx", "ct2", "neuron", "openvino"]
    assert got["spec_field"] is True and got["hint"] == "THROUGHPUT"  # its options, nested under its name
    assert got["auto"] == ["openvino", "OpenVINO model in the folder (openvino/openvino_model.xml)"]
    assert got["hub_openvino"] == ["config.json", "openvino/openvino_model.bin", "openvino/openvino_model.xml",
                                   "tokenizer.json"]
    assert {"openvino/openvino_model.xml", "openvino/openvino_model.bin", "model.safetensors"} <= set(got["hub_auto"])
    assert "auto | torch | onnx | ct2 | neuron | openvino" in " ".join(got["cli"].split())  # serve --backend lists it
    assert "openvino" in got["missing"]  # its runtime is absent here: the error names its extra
