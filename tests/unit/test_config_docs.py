"""docs/configuration.md's tables are generated from the settings classes: this fails when they drift."""

from __future__ import annotations

import re
import subprocess
import sys

from core.config import BACKEND_OPTIONS, ModelSpec, Settings
from tests.support.server import ROOT


def test_configuration_docs_match_the_code():
    proc = subprocess.run([sys.executable, "scripts/config_docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + " (run: .venv/bin/python scripts/config_docs.py)"
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name in Settings.model_fields:
        assert f"| `{name}` | `TESSERA_{name.upper()}` |" in text, name
    for name in ModelSpec.model_fields:
        if name not in BACKEND_OPTIONS:
            assert f"| `{name}` |" in text, name
    for backend, model in BACKEND_OPTIONS.items():
        for name in model.model_fields:
            assert f"| `{backend}.{name}` |" in text, (backend, name)


def test_backend_options_are_nested_and_documented_per_backend():
    """Each backend's own options are its declaration, nested under its name in the spec and in a section of
    the docs of their own, each with the flat key older specs used."""
    from core.backends.catalog import names

    assert set(BACKEND_OPTIONS) <= set(names())
    assert set(BACKEND_OPTIONS["onnx"].model_fields) == {"file", "workers", "spin", "optimized", "providers"}
    assert BACKEND_OPTIONS["onnx"].flat == {"onnx_file": "file", "workers": "workers", "ort_spin": "spin",
                                            "ort_optimized": "optimized", "providers": "providers"}
    assert BACKEND_OPTIONS["torch"].flat == {"compile": "compile"}
    text = (ROOT / "docs" / "configuration.md").read_text()
    spec = text[text.index("<!-- generated:spec -->"):text.index("<!-- end:spec -->")]
    sections = re.split(r"^### ", spec, flags=re.M)[1:]
    for name in ModelSpec.model_fields:
        if name in BACKEND_OPTIONS:
            assert not any(f"| `{name}` |" in s for s in sections), name
            continue
        (section,) = [s for s in sections if f"| `{name}` |" in s]
        assert section.startswith("Every backend\n"), (name, section[:40])
    for backend, model in BACKEND_OPTIONS.items():
        for name in model.model_fields:
            (section,) = [s for s in sections if f"| `{backend}.{name}` |" in s]
            assert section.startswith(f"`backend: {backend}` only\n"), (backend, name, section[:40])
            flat = [key for key, field in model.flat.items() if field == name]
            if flat:
                assert f"| `{backend}.{name}` | `{flat[0]}` |" in section
