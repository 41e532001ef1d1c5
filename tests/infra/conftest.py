"""Shared helpers for the infra tests: parse templates, fake AWS credentials (scripts load through
tests/support/modules.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAMBDA_TEMPLATE = ROOT / "infra" / "lambda" / "template.yaml"
SAGEMAKER_TEMPLATE = ROOT / "infra" / "sagemaker" / "endpoint.yaml"
PARAM_FILES = sorted((ROOT / "infra" / "sagemaker").glob("params-*.json"))


def parse_template(path: Path) -> dict:
    """The template as plain data (short-form tags like !Ref become {"Ref": ...}), as cfn-lint reads it."""
    from cfnlint.decode import decode_str

    template, matches = decode_str(path.read_text())
    assert not matches, matches
    return json.loads(json.dumps(template))


def read_params(path: Path) -> dict[str, str]:
    return {p["ParameterKey"]: p["ParameterValue"] for p in json.loads(path.read_text())}


@pytest.fixture
def fake_aws(monkeypatch):
    """Credentials and region that let botocore build clients; with Stubber nothing leaves the machine."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
