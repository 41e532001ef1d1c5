"""Infinity's and TEI's command lines, as their READMEs print them, over Tessera's settings; typos on the
command line and in ``TESSERA_*`` variables refused with the nearest name.

The README lines are quoted verbatim (michaelfeil/infinity README.md at fcb951c; huggingface/
text-embeddings-inference README.md at 0d124dc), with their shell variables as the READMEs set them; the part
after the program (``infinity_emb``, ``text-embeddings-router``) or the image name is what Tessera is given."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from core.cli import main, read_command_line, settings_from_args
from core.errors import ConfigError
from tests.support.server import ROOT, environ_without_settings, free_port, running_process

INFINITY_VARS = {"port": "7997", "model1": "michaelfeil/bge-small-en-v1.5",
                 "model2": "mixedbread-ai/mxbai-rerank-xsmall-v1", "volume": "/tmp/data"}
TEI_VARS = {"model": "Qwen/Qwen3-Embedding-0.6B", "volume": "/tmp/data"}


def after_program(line: str, variables: dict[str, str]) -> list[str]:
    """The arguments a README line hands to the server: after ``infinity_emb`` / ``text-embeddings-router``,
    or after the image of a ``docker run``."""
    words = shlex.split(_expand(line, variables))
    for i, word in enumerate(words):
        if word in ("infinity_emb", "text-embeddings-router") or word.startswith(
                ("michaelf34/infinity:", "ghcr.io/huggingface/text-embeddings-inference:")):
            return words[i + 1:]
    raise AssertionError(f"no program in {line!r}")


def _expand(line: str, variables: dict[str, str]) -> str:
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        line = line.replace("$" + name, value)
    return line


def settings_of(argv: list[str], environ: dict[str, str] | None = None):
    args, compat = read_command_line(argv, environ or {})
    return settings_from_args(args, compat)


def specs(settings) -> list[dict]:
    return [{k: v for k, v in m.model_dump(exclude_unset=True, mode="json").items() if k != "device"}
            for m in settings.models]  # (device: auto is resolved when the spec is read)


# --- Infinity ----------------------------------------------------------------------------------------------

def test_infinity_readme_first_command():
    s = settings_of(after_program("infinity_emb v2 --model-id BAAI/bge-small-en-v1.5", {}))
    assert specs(s) == [{"path": "BAAI/bge-small-en-v1.5"}]
    assert s.model_specs()[0].served_name == "BAAI/bge-small-en-v1.5"  # Infinity's served name: the model id


def test_infinity_readme_docker_lines():
    gpu = after_program("docker run -it --gpus all -v $volume:/app/.cache -p $port:$port michaelf34/infinity:latest "
                        "v2 --model-id $model1 --model-id $model2 --port $port", INFINITY_VARS)
    s = settings_of(gpu)
    assert [m["path"] for m in specs(s)] == [INFINITY_VARS["model1"], INFINITY_VARS["model2"]] and s.port == 7997
    cpu = after_program("docker run -it -v $volume:/app/.cache -p $port:$port michaelf34/infinity:latest-cpu v2 "
                        "--engine optimum --model-id $model1 --model-id $model2 --port $port", INFINITY_VARS)
    assert [m.backend for m in settings_of(cpu).models] == ["onnx", "onnx"]  # optimum: ONNX Runtime, for both
    trt = after_program("docker run -it -v $volume:/app/.cache -p $port:$port michaelf34/infinity:latest-trt-onnx "
                        "v2 --engine optimum --device cuda --model-id $model1 --port $port", INFINITY_VARS)
    (m,) = settings_of(trt).models
    assert (m.backend, m.device) == ("onnx", "cuda")
    local = after_program('docker run -it   -v /tmp/models:/models  -p 8081:8081  michaelf34/infinity:latest v2  '
                          '--model-id "/models/bge-small-en-v1.5" --port 8081', {})
    s = settings_of(local)
    assert specs(s) == [{"path": "/models/bge-small-en-v1.5"}] and s.port == 8081


def test_infinity_repeated_flags_follow_the_model_ids():
    """README: `v2 --model-id model/id1 --model-id model/id2 --batch-size 8 --batch-size 4`; one value
    applies to every model; any other count is refused, as Infinity does."""
    s = settings_of(["v2", "--model-id", "model/id1", "--model-id", "model/id2", "--batch-size", "8", "--batch-size",
                     "4", "--served-model-name", "a", "--served-model-name", "b", "--dtype", "float16",
                     "--embedding-dtype", "int8", "--pooling-method", "cls", "--revision", "v1",
                     "--trust-remote-code", "--api-key", "secret123", "--url-prefix", "/v2", "--host", "0.0.0.0"])
    a, b = s.models
    assert (a.name, a.max_batch_size, b.name, b.max_batch_size) == ("a", 8, "b", 4)
    for m in (a, b):
        assert (m.dtype, m.embedding_dtype, m.pooling, m.revision, m.trust_remote_code) == (
            "float16", "int8", "cls", "v1", True)
    assert (s.api_keys, s.url_prefix, s.host) == (["secret123"], "/v2", "0.0.0.0")
    with pytest.raises(ConfigError, match=r"--batch-size given 2 times for 3 --model-id"):
        settings_of(["v2", "--model-id", "m1", "--model-id", "m2", "--model-id", "m3", "--batch-size", "32",
                     "--batch-size", "32"])
    for engine, backend in (("torch", "torch"), ("ctranslate2", "ct2"), ("neuron", "neuron")):
        assert settings_of(["v2", "--model-id", "m/x", "--engine", engine]).models[0].backend == backend
    with pytest.raises(ConfigError, match="--device 'mps': not offered here"):
        settings_of(["v2", "--model-id", "m/x", "--device", "mps"])


def test_infinity_environment_variables():
    """README: INFINITY_MODEL_ID="model/id1;model/id2;" && INFINITY_BATCH_SIZE="8;4;"; INFINITY_API_KEY."""
    environ = {"INFINITY_MODEL_ID": "model/id1;model/id2;", "INFINITY_BATCH_SIZE": "8;4;",
               "INFINITY_API_KEY": "secret123", "INFINITY_PORT": "7997", "INFINITY_TRUST_REMOTE_CODE": "false"}
    s = settings_of(["v2"], environ)
    assert [(m.path.as_posix(), m.max_batch_size, m.trust_remote_code) for m in s.models] == [
        ("model/id1", 8, False), ("model/id2", 4, False)]
    assert (s.api_keys, s.port) == (["secret123"], 7997)
    # the command line wins over the variable
    assert [m.path.as_posix() for m in settings_of(["v2", "--model-id", "x/y"], {
        "INFINITY_MODEL_ID": "a/b", "INFINITY_BATCH_SIZE": "8"}).models] == ["x/y"]


# --- TEI ---------------------------------------------------------------------------------------------------

def test_tei_readme_lines():
    s = settings_of(after_program("text-embeddings-router --model-id $model --port 8080", TEI_VARS))
    assert specs(s) == [{"path": TEI_VARS["model"]}] and s.port == 8080
    docker = after_program("docker run --gpus all -p 8080:80 -v $volume:/data --pull always "
                           "ghcr.io/huggingface/text-embeddings-inference:cuda-1.9 --model-id $model", TEI_VARS)
    assert specs(settings_of(docker)) == [{"path": TEI_VARS["model"]}]
    local = after_program("docker run --gpus all -p 8080:80 -v $volume:/data --pull always "
                          "ghcr.io/huggingface/text-embeddings-inference:cuda-1.9 --model-id /data/Qwen3-Embedding-0.6B",
                          TEI_VARS)
    assert specs(settings_of(local)) == [{"path": "/data/Qwen3-Embedding-0.6B"}]
    splade = after_program("docker run --gpus all -p 8080:80 -v $volume:/data --pull always "
                           "ghcr.io/huggingface/text-embeddings-inference:cuda-1.9 --model-id $model --pooling splade",
                           {**TEI_VARS, "model": "naver/efficient-splade-VI-BT-large-query"})
    assert settings_of(splade).models[0].task == "sparse"


def test_tei_flags_map_onto_the_settings():
    s = settings_of(["--model-id", "BAAI/bge-large-en-v1.5", "--revision", "refs/pr/5", "--dtype", "float16",
                     "--pooling", "last-token", "--max-batch-tokens", "2048", "--max-batch-requests", "16",
                     "--max-client-batch-size", "64", "--max-concurrent-requests", "100", "--auto-truncate",
                     "--default-prompt", "query: ", "--hostname", "0.0.0.0", "--port", "3000", "--api-key", "k",
                     "--served-model-name", "bge", "--payload-limit", "1000000", "--json-output",
                     "--cors-allow-origin", "https://a.example.com", "--tokenization-workers", "3"])
    (m,) = s.models
    assert (m.name, m.revision, m.dtype, m.pooling, m.max_batch_tokens, m.max_batch_size) == (
        "bge", "refs/pr/5", "float16", "lasttoken", 2048, 16)
    assert m.prompts == {"default": "query: "} and m.default_prompt_name == "default"
    assert (s.max_items_per_request, s.max_inflight_requests, s.host, s.port, s.api_keys, s.max_request_bytes) == (
        64, 100, "0.0.0.0", 3000, ["k"], 1_000_000)
    assert (s.log_format, s.cors_origins) == ("json", ["https://a.example.com"])
    assert s.tokenization_workers == 3 and s.tokenizing_threads == 3
    named = settings_of(["--model-id", "m/x", "--default-prompt-name", "query"]).models[0]
    assert named.default_prompt_name == "query"
    with pytest.raises(ConfigError, match="--auto-truncate false: not offered"):
        settings_of(["--model-id", "m/x", "--auto-truncate", "false"])
    assert settings_of(["--model-id", "m/x", "--dense-path", "2_Dense_1024"]).models[0].dense_path == "2_Dense_1024"


# --- typos and one-value forms -------------------------------------------------------------------------------

def test_an_unknown_flag_gets_the_nearest_and_the_one_line_form(capsys):
    assert main(["serve", "--modle", "/m", "--batch-sise", "8"]) == 2
    err = capsys.readouterr().err
    assert "unknown option --modle (did you mean --model?)" in err
    assert "unknown option --batch-sise (did you mean --batch-size?)" in err
    assert "--model path=PATH,name=NAME,dtype=int8" in err and "unrecognized arguments" not in err
    assert err.splitlines()[-1].startswith("tessera: unknown option --modle")  # one line after the usage
    assert main(["v2", "--model-idd", "x"]) == 2
    assert "did you mean --model-id?" in capsys.readouterr().err


@pytest.mark.parametrize("variable, hint", [
    ("TESSERA_MODLES", "did you mean TESSERA_MODELS?"),
    ("TESSERA_MODEL", "did you mean TESSERA_MODELS?"),
    ("TESSERA_DTYPE", "dtype is a model's"),
])
def test_an_unknown_tessera_variable_stops_the_start(variable, hint, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(variable, str(tmp_path))
    assert main(["serve"]) == 2  # before any model loads
    err = capsys.readouterr().err
    assert f"{variable}: no such setting" in err and hint in err


def test_one_value_where_a_json_list_is_expected(tmp_path):
    from core.config import settings_from_env

    s = settings_from_env({"TESSERA_API_KEYS": "secret", "TESSERA_MODELS": str(tmp_path),
                           "TESSERA_MEDIA_ALLOW": "127.0.0.1/32"})
    assert (s.api_keys, [m.path for m in s.models], s.media_allow) == (["secret"], [tmp_path], ["127.0.0.1/32"])
    assert settings_from_env({"TESSERA_MODELS": f'{{"path": "{tmp_path}", "name": "one"}}'}).models[0].name == "one"
    assert settings_from_env({"TESSERA_API_KEYS": '["a", "b"]'}).api_keys == ["a", "b"]  # the JSON form still


def test_api_key_takes_a_json_list_as_its_help_says():
    assert settings_of(["serve", "--api-key", '["a","b"]']).api_keys == ["a", "b"]
    assert settings_of(["serve", "--api-key", "a", "--api-key", "b"]).api_keys == ["a", "b"]
    with pytest.raises(ConfigError, match="JSON list of keys"):
        settings_of(["serve", "--api-key", '["a",'])


# --- served for real, started the way the READMEs start their servers ----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("form", ["infinity", "tei"])
def test_the_tessera_script_serves_an_infinity_or_tei_command_line(form, minilm_onnx_dir, st_minilm):
    port = free_port()
    script = Path(sys.executable).parent / "tessera"
    assert script.exists(), "the tessera console script (pyproject [project.scripts]) is not installed"
    if form == "infinity":
        argv = ["v2", "--model-id", str(minilm_onnx_dir), "--served-model-name", "mini", "--engine", "optimum",
                "--batch-size", "16", "--host", "127.0.0.1", "--port", str(port)]
    else:
        argv = ["--model-id", str(minilm_onnx_dir), "--served-model-name", "mini", "--max-batch-tokens", "512",
                "--hostname", "127.0.0.1", "--port", str(port)]
    env = {**environ_without_settings("OTEL_"), "HF_HUB_OFFLINE": "1", "TESSERA_THREADS": "2",
           "PYTHONPATH": str(ROOT)}
    with running_process([str(script), *argv], env, port=port, name=f"compat-{form}") as (base, _proc):
        got = httpx.post(base + "/v1/embeddings", json={"model": "mini", "input": ["hello world"]}, timeout=60)
        assert got.status_code == 200, got.text
        card = httpx.get(base + "/v1/models", timeout=10).json()["data"][0]
    assert card["id"] == "mini" and card["backend"] == "onnx"
    np.testing.assert_allclose(got.json()["data"][0]["embedding"], st_minilm.encode(["hello world"])[0], atol=1e-4)


def test_the_console_script_is_declared():
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tessera"] == "core.cli:main"
    done = subprocess.run([sys.executable, "-m", "core", "v2", "--help"], capture_output=True, text=True, timeout=60,
                          env={**environ_without_settings(), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "--model-id" in done.stdout


def test_flags_with_nothing_to_change_are_accepted_with_a_note_and_preload_only_prepares():
    args, compat = read_command_line(["v2", "--model-id", "m/x", "--model-warmup", "--no-vector-disk-cache",
                                      "--device-id", "0", "--preload-only"], {})
    assert compat.preload_only and args.command == "serve"
    assert {n.split()[0] for n in compat.notes} == {"--model-warmup", "--vector-disk-cache", "--device-id"}
    _, compat = read_command_line(["v2"], {"INFINITY_MODEL_ID": "m/x", "INFINITY_MODLE_ID": "y"})
    assert any("INFINITY_MODLE_ID" in n and "did you mean INFINITY_MODEL_ID?" in n for n in compat.notes)
