"""A start with several models logs each one's load as it begins and ends, numbered (i/N), with the backend
and the time it took, so a slow multi-model start shows where it is."""

from __future__ import annotations

import json
import logging

import pytest

from core.config import settings_from_env
from core.engine import Registry

pytestmark = pytest.mark.slow


def test_each_model_load_is_numbered_in_the_log(minilm_onnx_dir, tmp_path, caplog):
    models = [{"path": str(minilm_onnx_dir), "name": "first", "backend": "onnx"},
              {"path": str(tmp_path / "missing"), "name": "second"},
              {"path": str(minilm_onnx_dir), "name": "third", "backend": "onnx", "dtype": "int8"}]
    settings = settings_from_env({"TESSERA_MODELS": json.dumps(models), "TESSERA_ALLOW_DEGRADED": "true"})
    with caplog.at_level(logging.INFO, logger="core.engine"):
        registry = Registry.from_settings(settings)
    lines = [r.getMessage() for r in caplog.records if r.name == "core.engine"]
    starts = [line for line in lines if line.startswith("loading model ")]
    assert [line.split(":")[0] for line in starts] == ["loading model 1/3", "loading model 2/3", "loading model 3/3"]
    assert any(line.startswith("loaded model 1/3: first (") and "backend=onnx" in line for line in lines)
    assert not any("{'" in line for line in lines)  # key=value, not a dict's repr
    assert any(line.startswith("loaded model 3/3: third (") for line in lines)
    assert any(line.startswith("model second failed to load") for line in lines)
    assert sorted(registry.engines) == ["first", "third"] and list(registry.failed) == ["second"]
