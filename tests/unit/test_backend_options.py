"""A backend's own spec options: nested under its name (``onnx: {workers: 2}``), declared by the backend,
and still set by the flat keys specs used before (``workers: 2``) wherever a spec is read or copied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.cli import build_parser, settings_from_args
from core.cli_compat import parse as compat_parse
from core.config import ModelSpec, settings_from_env, unknown_variables
from core.errors import ConfigError

FLAT = {"onnx_file": "onnx/model.onnx", "workers": 2, "ort_spin": False, "ort_optimized": True,
        "providers": ["CPUExecutionProvider"], "compile": True}
NESTED = {"onnx": {"file": "onnx/model.onnx", "workers": 2, "spin": False, "optimized": True,
                   "providers": ["CPUExecutionProvider"]}, "torch": {"compile": True}}


def test_flat_keys_set_the_nested_options(tmp_path):
    flat = ModelSpec(path=tmp_path, device="cpu", **FLAT)
    nested = ModelSpec(path=tmp_path, device="cpu", **NESTED)
    assert flat == nested
    assert flat.onnx.file == tmp_path / "onnx" / "model.onnx"  # relative to the model folder, as before
    assert (flat.onnx.workers, flat.onnx.spin, flat.onnx.optimized, flat.torch.compile) == (2, False, True, True)
    plain = ModelSpec(path=tmp_path, device="cpu")
    assert plain.onnx.workers is None  # defaults without either form
    assert plain.model_dump(exclude_unset=True) == {"path": tmp_path, "device": "cpu"}  # options unset stay unset


def test_flat_keys_through_the_environment_a_config_file_and_the_command_line(tmp_path):
    env = settings_from_env({"TESSERA_MODELS": json.dumps([{"path": str(tmp_path), "device": "cpu", **FLAT}])})
    (from_env,) = env.models
    config = tmp_path / "tessera.yaml"
    config.write_text(f"models:\n  - path: {tmp_path}\n    device: cpu\n    workers: 2\n    ort_spin: false\n")
    (from_file,) = settings_from_env({"TESSERA_CONFIG": str(config)}).models
    (from_cli,) = settings_from_args(build_parser().parse_args([
        "serve", "--model", f"path={tmp_path},device=cpu,workers=2,providers=CPUExecutionProvider,compile=true"])).models
    assert from_env == ModelSpec(path=tmp_path, device="cpu", **NESTED)
    assert (from_file.onnx.workers, from_file.onnx.spin) == (2, False)
    assert (from_cli.onnx.workers, from_cli.onnx.providers, from_cli.torch.compile) == (2, ["CPUExecutionProvider"], True)
    (nested,) = settings_from_args(build_parser().parse_args([
        "serve", "--model", f"onnx.workers=3,path={tmp_path},device=cpu,onnx.providers=A;B,torch.compile=true"])).models
    assert (nested.onnx.workers, nested.onnx.providers, nested.torch.compile) == (3, ["A", "B"], True)


def test_infinity_s_compile_flag_sets_the_torch_option(tmp_path):
    compat, _rest = compat_parse(["--model-id", str(tmp_path), "--compile"], {})
    (spec,) = compat.apply([])
    assert ModelSpec(**spec, device="cpu").torch.compile is True


def test_both_forms_of_one_option_are_refused(tmp_path):
    models = [{"path": str(tmp_path), "device": "cpu", "workers": 2, "onnx": {"workers": 3}}]
    with pytest.raises(ConfigError, match=r"workers and onnx\.workers both given: keep onnx\.workers"):
        settings_from_env({"TESSERA_MODELS": json.dumps(models)})


def test_problems_name_the_option_and_the_nearest_one(tmp_path):
    models = [{"path": str(tmp_path), "device": "cpu", "onnx": {"wrokers": 2}}, {"path": str(tmp_path), "wokers": 2,
                                                                                  "name": "b"}]
    with pytest.raises(ConfigError) as caught:
        settings_from_env({"TESSERA_MODELS": json.dumps(models)})
    assert "models[0].onnx.wrokers: unknown option (did you mean 'workers'?)" in caught.value.problems
    assert "models[1].wokers: unknown option (did you mean 'workers'?)" in caught.value.problems
    (problem,) = unknown_variables({"TESSERA_WORKERS": "2"})
    assert "workers is a model's" in problem


def test_copies_take_flat_keys_and_records_keep_the_flat_form(tmp_path):
    spec = ModelSpec(path=tmp_path, device="cpu", backend="onnx", workers=2)
    copy = spec.model_copy(update={"workers": 1, "backend": "auto"})
    assert (copy.onnx.workers, copy.backend, spec.onnx.workers) == (1, "auto", 2)
    dumped = spec.flat_dump(mode="json", exclude={"workers"})
    assert "onnx" not in dumped and "torch" not in dumped and "workers" not in dumped
    assert (dumped["onnx_file"], dumped["ort_spin"], dumped["compile"]) == (None, "run", False)


def test_the_options_models_are_the_backends_declarations():
    from core.backends.catalog import backend_class

    assert ModelSpec.model_fields["onnx"].annotation is backend_class("onnx").Options
    assert ModelSpec.model_fields["torch"].annotation is backend_class("torch").Options
    assert "ct2" not in ModelSpec.model_fields  # a backend without options adds no field
    assert Path(ModelSpec.__module__.replace(".", "/")).name == "config"
