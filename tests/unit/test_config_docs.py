"""docs/configuration.md's tables are generated from the settings classes: this fails when they drift."""

from __future__ import annotations

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
