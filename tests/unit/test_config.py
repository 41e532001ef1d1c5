"""Settings from env vars, config files and the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from core.cli import build_parser, settings_from_args
from core.config import ModelSpec, Settings, default_model_path
from tests.support.server import ROOT


def test_default_is_the_embedded_model(monkeypatch):
    monkeypatch.delenv("TESSERA_MODELS", raising=False)
    monkeypatch.delenv("TESSERA_CONFIG", raising=False)
    specs = Settings().model_specs()
    assert len(specs) == 1 and specs[0].path == default_model_path()
    assert specs[0].served_name == "all-MiniLM-L6-v2"
    assert (specs[0].path / "config.json").exists()


def test_models_and_options_from_env(monkeypatch, tmp_path):
    models = [{"path": str(tmp_path / "a"), "name": "a", "backend": "onnx", "max_batch_tokens": 999},
              {"path": str(tmp_path / "b")}]
    monkeypatch.setenv("TESSERA_MODELS", json.dumps(models))
    monkeypatch.setenv("TESSERA_API_KEYS", '["s1"]')
    monkeypatch.setenv("TESSERA_REQUEST_TIMEOUT_S", "2.5")
    s = Settings()
    assert [m.served_name for m in s.model_specs()] == ["a", "b"]
    assert s.models[0].backend == "onnx" and s.models[0].max_batch_tokens == 999
    assert s.api_keys == ["s1"] and s.request_timeout_s == 2.5


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file(monkeypatch, tmp_path, suffix):
    data = {"models": [{"path": "/m/one", "name": "one", "task": "embed"}], "port": 9001}
    path = tmp_path / f"cfg{suffix}"
    if suffix == ".yaml":
        import yaml

        path.write_text(yaml.safe_dump(data))
    else:
        path.write_text(json.dumps(data))
    monkeypatch.setenv("TESSERA_CONFIG", str(path))
    monkeypatch.delenv("TESSERA_MODELS", raising=False)
    s = Settings()
    assert s.models[0].served_name == "one" and s.port == 9001
    monkeypatch.setenv("TESSERA_PORT", "9002")  # env wins over the file
    assert Settings().port == 9002


def test_invalid_settings_are_refused(monkeypatch):
    with pytest.raises(ValidationError, match="unique"):
        Settings(models=[{"path": "/x/m"}, {"path": "/y/m"}])
    with pytest.raises(ValidationError):
        ModelSpec(path="/m", max_batch_tokens=0)
    with pytest.raises(ValidationError):
        ModelSpec(path="/m", unknown_field=1)


def test_cli_models_and_options():
    args = build_parser().parse_args(["serve", "--model", "/models/a:alpha", "--model", "/models/b",
                                      "--port", "9100", "--api-key", "x", "--backend", "onnx"])
    s = settings_from_args(args)
    assert [(str(m.path), m.served_name, m.backend) for m in s.models] == [
        ("/models/a", "alpha", "onnx"), ("/models/b", "b", "onnx")]
    assert s.port == 9100 and s.api_keys == ["x"]


def test_cli_help_lists_every_option_with_its_env_var():
    out = subprocess.run([sys.executable, "-m", "core", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    for name in Settings.model_fields:
        assert f"TESSERA_{name.upper()}" in out, name
    assert "--model PATH[:NAME]" in out
    flat = " ".join(out.split())
    assert "(default: None)" not in flat  # argparse's own, which hid every real default
    assert "TESSERA_PORT; default 8000)" in flat and "TESSERA_SHUTDOWN_GRACE_S; default 25.0)" in flat
    assert "auto | torch | onnx | ct2 | neuron" in flat


def test_settings_from_env_reads_the_mapping_it_is_given(monkeypatch):
    from core.config import settings_from_env

    monkeypatch.setenv("TESSERA_PORT", "1111")
    assert settings_from_env({"TESSERA_PORT": "2222"}).port == 2222
    assert settings_from_env({}).port == 8000  # not the process's TESSERA_PORT
    assert settings_from_env({"TESSERA_PORT": "2222"}, port=3333).port == 3333  # overrides (the CLI) win


@pytest.mark.parametrize("environ, expected", [
    ({"TESSERA_MODELS": '[{"path": "/m", "name": "a"},]'}, "TESSERA_MODELS: not valid JSON"),
    ({"TESSERA_MODELS": '[{"path": "/m", "backen": "onnx"}]'},
     "models[0].backen: unknown option (did you mean 'backend'?)"),
    ({"TESSERA_MAX_INFLIGT_REQUESTS": "3", "TESSERA_CONFIG": "cfg.yaml"}, None),
    ({"TESSERA_CONFIG": "missing.yaml"}, "TESSERA_CONFIG: [Errno 2] No such file or directory: 'missing.yaml'"),
    ({"TESSERA_PORT": "http", "TESSERA_THREADS": "0"}, "port (env TESSERA_PORT): Input should be a valid integer"),
])
def test_configuration_errors_are_one_line_per_problem(environ, expected, tmp_path, monkeypatch):
    """What used to be 40–71-line tracebacks: one line per problem, naming the field, the value and a fix."""
    from core.config import settings_from_env
    from core.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text("models: []\nmax_inflight_requsts: 3\n")
    with pytest.raises(ConfigError) as caught:
        settings_from_env(environ)
    problems = caught.value.problems
    if expected is None:  # a typo in the file and one in a variable's name: both named, with the nearest setting
        assert problems == ["TESSERA_MAX_INFLIGT_REQUESTS: no such setting (did you mean TESSERA_MAX_INFLIGHT_REQUESTS?); "
                            "docs/configuration.md lists them all",
                            "max_inflight_requsts: unknown option (did you mean 'max_inflight_requests'?)"]
    else:
        assert problems[0].startswith(expected), problems
    assert all("\n" not in p for p in problems)
    if "TESSERA_THREADS" in environ:
        assert len(problems) == 2 and problems[1].startswith("threads (env TESSERA_THREADS): Input should be greater")


def test_api_key_problems_never_show_the_keys():
    from core.config import settings_from_env
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        settings_from_env({"TESSERA_API_KEYS": '["sekrit-key", " "]'})
    assert "sekrit" not in caught.value.message and "api_keys" in caught.value.message


def test_cli_exits_2_with_the_problems_and_no_traceback(tmp_path):
    """From another directory, a relative TESSERA_CONFIG is that directory's file."""
    (tmp_path / "models.yaml").write_text("models:\n  - {path: /nowhere, backen: onnx}\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TESSERA_CONFIG": "models.yaml"}
    proc = subprocess.run([sys.executable, "-m", "core", "serve"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tessera: invalid configuration:", "  - models[0].backen: unknown option (did you mean 'backend'?)"]


def test_tokenizing_threads_default_to_half_the_runtime_threads(monkeypatch):
    """``tokenization_workers`` (TEI's --tokenization-workers): by default half of ``threads``, at least one; the
    engine starts that many tokenizing threads and /info reports the number."""
    assert [Settings(threads=n).tokenizing_threads for n in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert Settings(threads=2, tokenization_workers=4).tokenizing_threads == 4
    monkeypatch.setenv("TESSERA_TOKENIZATION_WORKERS", "5")
    assert Settings(threads=2).tokenizing_threads == 5
    with pytest.raises(ValidationError):
        Settings(tokenization_workers=0)
