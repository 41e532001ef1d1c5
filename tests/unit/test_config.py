"""Settings from env vars, config files and the command line."""

from __future__ import annotations

import json
import math
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


# --- every setting has a range a deployment could use; the rest is refused at start, by name -------------

def _models_of_settings():
    """Each settings model with how to build one from a field's value: Settings and SageMaker's (through
    settings_from_env, which reads only the mapping given), a model spec, its nested models (the chunking
    default, each backend's options)."""
    from adapters.sagemaker.models import SageMakerSettings
    from core.config import BACKEND_OPTIONS, ChunkingDefault, settings_from_env

    yield "Settings", Settings, lambda **field: settings_from_env({}, Settings, **field)
    yield "SageMakerSettings", SageMakerSettings, lambda **field: settings_from_env({}, SageMakerSettings, **field)
    yield "ModelSpec", ModelSpec, lambda **field: ModelSpec(path="/m", **field)
    yield "ChunkingDefault", ChunkingDefault, lambda **field: ChunkingDefault(**field)
    for backend, options in BACKEND_OPTIONS.items():
        yield (f"{backend} options", options,
               lambda backend=backend, **field: ModelSpec(path="/m", **{backend: field}))  # nested, as specs give them


def _kinds(annotation) -> set:
    """The scalar types an annotation admits (through Optional, unions, Annotated, lists and mappings)."""
    import typing
    from pathlib import Path

    args = typing.get_args(annotation)
    if annotation in (int, float, str, Path, bool):
        return {annotation}
    if typing.get_origin(annotation) is typing.Literal:
        return set()
    return {kind for arg in args for kind in _kinds(arg)}


def _fields(kind):
    for label, model, build in _models_of_settings():
        for name, field in model.model_fields.items():
            if kind in _kinds(field.annotation):
                yield pytest.param(build, name, field, id=f"{label}.{name}")


@pytest.mark.parametrize("build, name, field", list(_fields(int)) + list(_fields(float)))
def test_every_numeric_setting_has_a_finite_range(build, name, field):
    """A numeric setting added without a range fails here: -1, 10**20 (and for a float: inf, -inf, NaN) are
    refused, with the setting's name, and its default lies inside the range."""
    from core.errors import ConfigError

    build()  # the defaults are inside the ranges
    bad = [-1, 10**20] + ([math.inf, -math.inf, math.nan, 1e300] if float in _kinds(field.annotation) else [])
    for value in bad:
        with pytest.raises((ConfigError, ValidationError)) as refused:
            build(**{name: value})
        assert name in str(refused.value), (name, value, str(refused.value))


def _holding(annotation, text):
    """A value of ``annotation``'s shape that holds ``text`` (None: it holds no free text)."""
    import types
    import typing
    from pathlib import Path

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (str, Path):
        return text
    if origin is list:
        return [_holding(args[0], text)] if _holding(args[0], text) is not None else None
    if origin is dict:
        return {"name": _holding(args[1], text)} if _holding(args[1], text) is not None else None
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        found = [_holding(arg, text) for arg in args if arg is not type(None)]
        return next((value for value in found if value is not None), None)
    return None


@pytest.mark.parametrize("build, name, field", list(_fields(str)))
@pytest.mark.parametrize("char", ["\x00", "\r", "\x1b", "\x85"])
def test_no_string_setting_takes_a_control_character(build, name, field, char):
    """NUL in a path, CR/LF in a prefix, an origin or a key (a split log line, a header injected into an
    answer): refused for every string setting, including those added later. A prompt's text may hold line
    breaks (an instruction over several lines), never a NUL or an escape."""
    from core.errors import ConfigError

    if name == "prompts" and char == "\r":
        assert build(prompts={"query": "Instruct: find\r\nQuery: "}).prompts["query"].endswith("Query: ")
        return
    value = _holding(field.annotation, f"/tessera{char}x")
    assert value is not None, name
    with pytest.raises((ConfigError, ValidationError)) as refused:
        build(**{name: value})
    assert name in str(refused.value) or "TESSERA_CONFIG" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("environ, problem", [
    ({"TESSERA_PORT": "-1"}, "port (env TESSERA_PORT): Input should be greater than or equal to 1"),
    ({"TESSERA_PORT": "99999"}, "port (env TESSERA_PORT): Input should be less than or equal to 65535"),
    ({"TESSERA_PORT": "0"}, "port (env TESSERA_PORT): Input should be greater than or equal to 1"),
    ({"TESSERA_FRONTENDS": "100000"}, "frontends (env TESSERA_FRONTENDS): from 1 front end (1: one process) to 64"),
    ({"TESSERA_THREADS": "100000"}, "threads (env TESSERA_THREADS): Input should be less than or equal to 1024"),
    ({"TESSERA_MODELS": '[{"path": "/m", "max_queue_items": 100000000000000000000}]'},
     "models[0].max_queue_items: Input should be less than or equal to 10000000"),
    ({"TESSERA_URL_PREFIX": "/v2\r\nX-Injected: 1"}, "url_prefix (env TESSERA_URL_PREFIX): holds the control character "
     "U+000D"),
    ({"TESSERA_URL_PREFIX": "/v2\n"}, "url_prefix (env TESSERA_URL_PREFIX): holds the control character U+000A"),
    ({"TESSERA_URL_PREFIX": "/a/../admin"}, "url_prefix (env TESSERA_URL_PREFIX): '/a/../admin' is not a path prefix"),
    ({"TESSERA_URL_PREFIX": ".."}, "url_prefix (env TESSERA_URL_PREFIX): '/..' is not a path prefix"),
    ({"TESSERA_ROOT_PATH": "/tessera\x00"}, "root_path (env TESSERA_ROOT_PATH): holds the control character U+0000"),
    ({"TESSERA_ROOT_PATH": "/a b"}, "root_path (env TESSERA_ROOT_PATH): '/a b' is not a path prefix"),
    ({"TESSERA_REQUEST_TIMEOUT_S": "inf"}, "request_timeout_s (env TESSERA_REQUEST_TIMEOUT_S): Input should be a "
     "finite number"),
    ({"TESSERA_REQUEST_TIMEOUT_S": "nan"}, "request_timeout_s (env TESSERA_REQUEST_TIMEOUT_S): Input should be a "
     "finite number"),
    ({"TESSERA_REQUEST_TIMEOUT_S": "172800"}, "request_timeout_s (env TESSERA_REQUEST_TIMEOUT_S): Input should be "
     "less than or equal to 86400"),
    ({"TESSERA_MODELS": '[{"path": "/m", "chunking": {"size": 1, "overlap": 5}}]'},
     "models[0].chunking: overlap 5 must be less than the window's size 1"),
    ({"TESSERA_MODELS": '[{"path": "/m", "chunking": {"size": 64, "overlap": 64}}]'},
     "models[0].chunking: overlap 64 must be less than the window's size 64"),
])
def test_the_settings_a_deployment_cannot_use_are_refused_by_name(environ, problem):
    """Each was accepted without complaint: a port no socket takes, 100,000 front ends or threads, a queue of
    10^20 items, a prefix with CR/LF or '..', a root path with NUL, an infinite deadline, windows that overlap
    by more than their size."""
    from core.config import settings_from_env
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        settings_from_env(environ)
    assert len(refused.value.problems) == 1 and refused.value.problems[0].startswith(problem), refused.value.problems


def test_the_prefixes_a_deployment_uses_are_kept():
    from core.config import settings_from_env

    settings = settings_from_env({"TESSERA_URL_PREFIX": " v2/ ", "TESSERA_ROOT_PATH": "/api/tessera-1.0_x~y/"})
    assert settings.url_prefix == "/v2" and settings.root_path == "/api/tessera-1.0_x~y"
    assert settings_from_env({"TESSERA_PORT": "65535", "TESSERA_FRONTENDS": "64"}).port == 65535


def test_the_modal_settings_have_a_range_each():
    """adapters/modal/settings.py: every numeric field has its range in BOUNDS, and a value out of it (or not
    a number) is refused naming its variable."""
    import dataclasses

    from adapters.modal.settings import BOUNDS, ModalSettings, modal_settings

    numeric = {f.name for f in dataclasses.fields(ModalSettings) if f.type.split(" ")[0] in ("int", "float")
               or f.type.startswith(("int |", "float |"))}
    assert numeric == set(BOUNDS), numeric ^ set(BOUNDS)
    assert all(math.isfinite(low) and math.isfinite(high) for low, high in BOUNDS.values())
    variable = {"volume_version": "TESSERA_MODAL_VOLUME_VERSION"}
    for field, (low, high) in BOUNDS.items():
        name = variable.get(field, f"TESSERA_MODAL_{field.upper()}")
        for value in (str(high * 10 + 1), "-1", "nan", "inf", "x"):
            with pytest.raises(ValueError, match=rf"^{name}="):
                modal_settings({name: value})
    assert modal_settings({"TESSERA_MODAL_PORT": "65535", "TESSERA_MODAL_FRONTENDS": "64"}).port == 65535


# --- a file of API keys that yields no key is a start-up error -----------------------------------------------

@pytest.mark.parametrize("content", ["", "   \n\n\t \n", "\r\n"])
def test_a_keys_file_with_no_key_is_refused(tmp_path, content):
    """Such a file once turned authentication off (every route, /metrics too, answered without a key), where
    the same empty key in api_keys is refused."""
    from core.config import settings_from_env
    from core.errors import ConfigError

    keys = tmp_path / "keys"
    keys.write_text(content)
    with pytest.raises(ConfigError) as refused:
        settings_from_env({"TESSERA_API_KEYS_FILE": str(keys)})
    (problem,) = refused.value.problems
    assert problem.startswith(f"api_keys_file (env TESSERA_API_KEYS_FILE): {keys} holds no API key"), problem


def test_a_keys_file_that_cannot_be_read_is_refused(tmp_path):
    from core.config import settings_from_env
    from core.errors import ConfigError

    for path, reason in [("/nonexistent", "/nonexistent: no such file"), (str(tmp_path), "a directory")]:
        with pytest.raises(ConfigError) as refused:
            settings_from_env({"TESSERA_API_KEYS_FILE": path})
        assert refused.value.problems[0].startswith("api_keys_file (env TESSERA_API_KEYS_FILE): "), refused.value
        assert reason in refused.value.problems[0]
    binary = tmp_path / "keys.bin"
    binary.write_bytes(b"\xff\xfe\x00k")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        settings_from_env({"TESSERA_API_KEYS_FILE": str(binary)})


def test_the_keys_of_a_keys_file_are_served_and_never_shown(tmp_path):
    from core.config import settings_from_env
    from core.errors import ConfigError

    keys = tmp_path / "keys"
    keys.write_text("\n  sk-one  \n\nsk-two\n")
    assert settings_from_env({"TESSERA_API_KEYS_FILE": str(keys), "TESSERA_API_KEYS": "sk-zero"}).all_api_keys() == [
        "sk-zero", "sk-one", "sk-two"]
    keys.write_text("sk-one\nsk-\x1btwo\n")
    with pytest.raises(ConfigError) as refused:
        settings_from_env({"TESSERA_API_KEYS_FILE": str(keys)})
    assert "key 2 holds a control character" in refused.value.message and "sk-" not in refused.value.message


def test_a_keys_file_emptied_after_the_start_fails_the_app_not_its_auth(tmp_path):
    """The keys are read again when the app is built: a file emptied in between is refused there too."""
    from core.errors import ConfigError

    keys = tmp_path / "keys"
    keys.write_text("sk-one\n")
    settings = Settings(api_keys_file=keys)
    keys.write_text(" \n")
    with pytest.raises(ConfigError, match="holds no API key"):
        settings.all_api_keys()


def test_config_error_line_is_one_line():
    from core.config import config_error_line, settings_from_env
    from core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        settings_from_env({"TESSERA_PORT": "0", "TESSERA_THREADS": "0"})
    line = config_error_line(refused.value)
    assert "\n" not in line and line.startswith("invalid configuration: port (env TESSERA_PORT): ")
    assert "; threads (env TESSERA_THREADS): " in line
