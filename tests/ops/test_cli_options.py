"""The command line: one-line model specs, and the operations options (every one also a setting)."""

from __future__ import annotations

import pytest

from core.cli import build_parser, parse_model_spec, settings_from_args
from core.errors import ConfigError


def settings(*argv: str):
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_a_spec_in_one_line():
    spec = parse_model_spec('path=/m/e5,name=e5,backend=onnx,dtype=int8,"prompt=query, then: ",max_batch_size=16')
    assert spec == {"path": "/m/e5", "name": "e5", "backend": "onnx", "dtype": "int8", "max_batch_size": "16",
                    "prompts": {"default": "query, then: "}, "default_prompt_name": "default"}
    named = parse_model_spec("path=/m/bge,prompt.query=Represent this: ,prompt.doc=,providers=CUDAExecutionProvider;"
                             "CPUExecutionProvider")
    assert named["prompts"] == {"query": "Represent this: ", "doc": ""} and "default_prompt_name" not in named
    assert named["providers"] == ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_specs_become_typed_model_settings(tmp_path):
    s = settings("--model", f"path={tmp_path},name=e5,backend=onnx,dtype=int8,prompt=query: ,max_batch_size=16",
                 "--model", f"{tmp_path}:plain", "--model", f'{{"path": "{tmp_path}", "name": "j", "pooling": "cls"}}',
                 "--backend", "torch")
    e5, plain, j = s.models
    assert (e5.name, e5.backend, e5.dtype, e5.max_batch_size) == ("e5", "onnx", "int8", 16)
    assert e5.prompts == {"default": "query: "} and e5.default_prompt_name == "default"
    assert (plain.name, plain.backend) == ("plain", "torch")  # --backend fills in what a spec leaves out
    assert (j.name, j.pooling, j.backend) == ("j", "cls", "torch")


def test_a_chunking_default_in_one_line(tmp_path):
    (spec,) = settings("--model", f"path={tmp_path},name=long,chunking.size=128,chunking.overlap=16").models
    assert (spec.chunking.size, spec.chunking.overlap) == (128, 16)
    with pytest.raises(ConfigError, match=r"chunking\.overlap"):
        settings("--model", f"path={tmp_path},chunking.overlap=-3")


def test_bad_specs_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match=r"models\[0\]\.bakend: unknown option \(did you mean 'backend'\?\)"):
        settings("--model", f"path={tmp_path},bakend=onnx")
    with pytest.raises(ConfigError, match="max_batch_size"):
        settings("--model", f"path={tmp_path},max_batch_size=lots")
    with pytest.raises(ConfigError, match="needs path="):
        parse_model_spec("name=x,backend=onnx")
    with pytest.raises(ConfigError, match="given twice"):
        parse_model_spec("path=/a,name=x,name=y")


def test_operations_options(tmp_path):
    s = settings("--model", str(tmp_path), "--log-format", "json", "--root-path", "api/", "--url-prefix", "/v2/",
                 "--cors-origins", "https://a.example.com, http://localhost:3000", "--no-access-log")
    assert (s.log_format, s.root_path, s.url_prefix, s.access_log) == ("json", "/api", "/v2", False)
    assert s.cors_origins == ["https://a.example.com", "http://localhost:3000"]
    with pytest.raises(ConfigError, match="cors_origins"):
        settings("--cors-origins", "https://a.example.com/app")
    with pytest.raises(ConfigError, match="log_format"):
        settings("--log-format", "yaml")
