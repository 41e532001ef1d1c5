"""scripts/function_url_client.py: SigV4 signing for AWS_IAM function URLs, and the OpenAI SDK through
it against a real server on loopback with API keys on (x-api-key beside the SigV4 Authorization)."""

from __future__ import annotations

import os
import re

import httpx
import pytest
from botocore.credentials import Credentials

from tests.support.server import running_server

from .conftest import load_script

CREDS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token="session-token")


@pytest.fixture(scope="module")
def client_script():
    return load_script("function_url_client")


def signed(client_script, body: bytes, url="https://abc.lambda-url.eu-west-1.on.aws/v1/embeddings"):
    auth = client_script.SigV4("eu-west-1", credentials=CREDS)
    request = httpx.Request("POST", url, content=body, headers={"content-type": "application/json",
                                                                "connection": "keep-alive"})
    return auth.sign(request)


def test_signature_shape(client_script):
    request = signed(client_script, b'{"input": "a"}')
    header = request.headers["authorization"]
    match = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/(\d{8})/eu-west-1/lambda/aws4_request, "
                         r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})", header)
    assert match, header
    assert match.group(2) == "content-type;host;x-amz-date;x-amz-security-token"
    assert request.headers["x-amz-date"].startswith(match.group(1))
    assert request.headers["x-amz-security-token"] == "session-token"
    other = signed(client_script, b'{"input": "b"}')
    assert other.headers["authorization"].rsplit("=", 1)[1] != match.group(3)  # the body is signed
    assert client_script.region_of("https://x1.lambda-url.ap-south-1.on.aws/") == "ap-south-1"
    assert client_script.region_of("http://127.0.0.1:8000") is None


@pytest.fixture(scope="module")
def server():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env["TESSERA_API_KEYS"] = '["url-key"]'
    with running_server(env, headers={"x-api-key": "url-key"}) as base:
        yield base


def test_openai_sdk_with_sigv4_and_an_api_key(client_script, server):
    from openai import OpenAI

    auth = client_script.SigV4("us-east-1", credentials=CREDS)
    client = OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, default_headers={"x-api-key": "url-key"},
                    http_client=httpx.Client(auth=auth))
    result = client.embeddings.create(model="all-MiniLM-L6-v2", input=["signed request"], encoding_format="float")
    assert len(result.data[0].embedding) == 384


@pytest.mark.parametrize("sigv4_first", [True, False])
def test_sigv4_authorization_does_not_hide_the_api_key(client_script, server, sigv4_first):
    """Whatever the header order, a SigV4 Authorization is not a Bearer token and x-api-key still counts."""
    request = signed(client_script, b'{"input": ["x"]}', url=server + "/v1/embeddings")
    pairs = [("authorization", request.headers["authorization"]), ("x-api-key", "url-key")]
    pairs = pairs if sigv4_first else pairs[::-1]
    ok = httpx.post(server + "/v1/embeddings", content=b'{"input": ["x"]}',
                    headers=[("content-type", "application/json"), *pairs])
    assert ok.status_code == 200, ok.text
    denied = httpx.post(server + "/v1/embeddings", content=b'{"input": ["x"]}',
                        headers=[("content-type", "application/json"), pairs[0] if sigv4_first else pairs[1]])
    assert denied.status_code == 401
    assert denied.json()["error"]["type"]
