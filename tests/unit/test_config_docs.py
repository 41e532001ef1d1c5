"""docs/configuration.md's tables are generated from the settings classes: this fails when they drift."""

from __future__ import annotations

import re
import subprocess
import sys

from core.config import ModelSpec, Settings
from tests.support.server import ROOT


def test_configuration_docs_match_the_code():
    proc = subprocess.run([sys.executable, "scripts/config_docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + " (run: .venv/bin/python scripts/config_docs.py)"
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"| `{name}` | `TESSERA_{name.upper()}` |" in text, name
    for name in ModelSpec.model_fields:
        assert f"| `{name}` |" in text, name


def test_backend_only_fields_are_grouped_in_the_class_and_the_docs():
    from core.backends.registry import BACKENDS
    from core.config import spec_field_backend

    groups = [spec_field_backend(name) for name in ModelSpec.model_fields]
    assert spec_field_backend("path") is None and spec_field_backend("dtype") is None
    assert {n for n in ModelSpec.model_fields if spec_field_backend(n) == "onnx"} == {
        "onnx_file", "workers", "ort_spin", "ort_optimized", "providers"}
    assert spec_field_backend("compile") == "torch"
    assert set(groups) - {None} <= set(BACKENDS)
    # declared in sections: the shared fields first, then each backend's own, one block per backend
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert runs[0] is None and len(runs) == len(set(runs)), runs
    text = (ROOT / "docs" / "configuration.md").read_text()
    spec = text[text.index("<!-- generated:spec -->"):text.index("<!-- end:spec -->")]
    sections = re.split(r"^### ", spec, flags=re.M)[1:]
    for name in ModelSpec.model_fields:
        backend = spec_field_backend(name)
        heading = "Every backend" if backend is None else f"`backend: {backend}` only"
        (section,) = [s for s in sections if f"| `{name}` |" in s]
        assert section.startswith(heading + "\n"), (name, section[:40])
