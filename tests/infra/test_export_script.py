"""scripts/export_onnx.py as a user runs it: one line per stage, a check line per graph, and a summary whose
TESSERA_MODELS entries serve the graphs they name (no pages of exporter and quantizer messages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.tasks.embed import EmbedRequest
from tests.support.server import ROOT


def test_export_prints_its_stages_checks_and_entries(minilm_dir, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "scripts/export_onnx.py", str(minilm_dir), str(out), "--int8", "fast"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = (run.stderr + run.stdout).strip().splitlines()
    assert lines[0].startswith("export (encoder head, fp32): model.onnx (") and " MB) in " in lines[0]
    assert lines[1].startswith("int8 fast: model_int8.onnx (")
    assert lines[2].startswith("check model.onnx: worst cosine vs torch ") and lines[2].endswith("(ok)")
    assert lines[3].startswith("check model_int8.onnx: worst cosine vs torch ")
    assert lines[4] == f"wrote {out}:"
    entries = [json.loads(line.split("TESSERA_MODELS='", 1)[1].rstrip("'"))[0] for line in lines[5:]]
    assert len(lines) == 7 and [e.get("dtype") for e in entries] == [None, "int8"]
    vectors = []
    for entry in entries:
        engine = Engine.load(ModelSpec(**entry), Settings(threads=2), warm_up=False)
        assert engine.backend.name == "onnx" and engine.spec.dtype == entry.get("dtype", "float32")
        vectors.append(engine.run_sync(EmbedRequest(texts=["a short text"])).vectors[0])
    assert 0.9 < float(vectors[0] @ vectors[1]) < 1.0  # the int8 graph: close to, not the same as, fp32
