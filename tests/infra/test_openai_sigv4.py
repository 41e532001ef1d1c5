"""scripts/openai_sigv4.py: SigV4 signing for AWS_IAM function URLs, and the OpenAI SDK through
it against a real server on loopback with API keys on (x-api-key beside the SigV4 Authorization)."""

from __future__ import annotations

import re

import httpx
import pytest
from botocore.credentials import Credentials

from tests.support.modules import load_script
from tests.support.server import environ_without_settings, running_server

CREDS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token="session-token")


@pytest.fixture(scope="module")
def client_script():
    return load_script("openai_sigv4")


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
    env = environ_without_settings()
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


def test_sagemaker_auth_readdresses_and_signs(client_script):
    auth = client_script.SageMakerRuntime("tessera-sm", "us-east-1", credentials=CREDS, inference_component="ic-1")
    request = httpx.Request("POST", "https://sagemaker.invalid/v1/embeddings", content=b"{}",
                            headers={"content-type": "application/json"})
    sent = next(auth.auth_flow(request))
    assert str(sent.url) == "https://runtime.sagemaker.us-east-1.amazonaws.com/endpoints/tessera-sm/invocations"
    assert sent.headers["host"] == "runtime.sagemaker.us-east-1.amazonaws.com"
    assert sent.headers["x-amzn-sagemaker-custom-attributes"] == "route=embeddings"
    assert sent.headers["x-amzn-sagemaker-inference-component"] == "ic-1"
    assert "/us-east-1/sagemaker/aws4_request" in sent.headers["authorization"]
    with pytest.raises(ValueError):
        next(auth.auth_flow(httpx.Request("POST", "https://x/embeddings")))


def test_openai_sdk_through_a_packaged_sagemaker_container(client_script, tmp_path, minilm_dir, packaged_int8_onnx,
                                                           st_minilm):
    """package_model.py → unpack as SageMaker does → adapters/sagemaker/serve on loopback → the OpenAI SDK
    via SageMakerRuntime (re-addressed to the container's /invocations) → same vectors as
    sentence-transformers."""
    import shutil
    import tarfile

    import numpy as np

    from tests.adapters.conftest import sagemaker_process

    package = load_script("package_model")
    folder = tmp_path / "src" / "minilm"
    (folder / "onnx").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "modules.json", "sentence_bert_config.json"):
        shutil.copy(minilm_dir / name, folder / name)
    shutil.copytree(minilm_dir / "1_Pooling", folder / "1_Pooling")
    shutil.copy(packaged_int8_onnx, folder / "onnx" / "model_int8.onnx")
    config = tmp_path / "tessera.yaml"
    config.write_text("models:\n  - {path: minilm, name: minilm, backend: onnx, dtype: int8}\n")
    tarball = package.build_tarball([folder], tmp_path / "model.tar.gz", config=config)
    model_dir = tmp_path / "opt-ml-model"
    with tarfile.open(tarball) as tar:
        tar.extractall(model_dir, filter="data")

    from openai import OpenAI

    texts = ["SageMaker through the OpenAI SDK", "zweiter Satz"]
    with sagemaker_process(model_dir) as (base, _):
        auth = client_script.SageMakerRuntime("tessera-sm", "us-east-1", credentials=CREDS,
                                              invocations_url=base + "/invocations")
        client = OpenAI(base_url="https://sagemaker.invalid/v1", api_key="unused", max_retries=0,
                        http_client=httpx.Client(auth=auth))
        result = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    got = np.array([d.embedding for d in result.data])
    want = st_minilm.encode(texts, normalize_embeddings=True)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert got.shape == (2, 384) and cosine.min() > 0.99, cosine
