#!/usr/bin/env python
"""The OpenAI SDK against Tessera on AWS, signing each request with SigV4 (botocore) in an ``httpx.Auth``:
a Lambda function URL with ``AWS_IAM`` auth, or a SageMaker endpoint (the request is re-addressed to
``/endpoints/NAME/invocations`` with ``route=...`` in the custom attributes).

    python scripts/openai_sigv4.py url https://ID.lambda-url.REGION.on.aws "text" ["text" ...]
        [--model all-MiniLM-L6-v2] [--api-key KEY] [--region REGION]
    python scripts/openai_sigv4.py sagemaker ENDPOINT "text" ... --region REGION [--inference-component NAME]

Credentials come from the usual boto3 chain (environment, profile, instance role); the caller needs
``lambda:InvokeFunctionUrl`` and ``lambda:InvokeFunction`` on the function (alias). Under IAM auth the
``Authorization`` header carries the signature, so an app API key (``TESSERA_API_KEYS``) goes in
``x-api-key`` instead. In your own code::

    from openai import OpenAI
    import httpx
    client = OpenAI(base_url=URL + "/v1", api_key="unused",
                    http_client=httpx.Client(auth=SigV4(region="us-east-1")))
    # SageMaker: any base_url ending in /v1 (the auth re-addresses every request)
    client = OpenAI(base_url="https://sagemaker/v1", api_key="unused",
                    http_client=httpx.Client(auth=SageMakerRuntime("tessera-sm", region="us-east-1")))

SageMaker callers need ``sagemaker:InvokeEndpoint`` on the endpoint.
"""

from __future__ import annotations

import argparse
import re
import sys

import httpx

URL_REGION = re.compile(r"\.lambda-url\.([a-z0-9-]+)\.on\.aws")


def region_of(url: str) -> str | None:
    found = URL_REGION.search(url)
    return found.group(1) if found else None


class SigV4(httpx.Auth):
    """Sign each request for ``service`` (``lambda`` for function URLs). Only ``host``, ``content-type``
    and the ``x-amz-*`` headers are signed: the others may be rewritten on the way (connection, ...)."""

    requires_request_body = True

    def __init__(self, region: str, service: str = "lambda", credentials=None) -> None:
        if credentials is None:
            import botocore.session

            credentials = botocore.session.get_session().get_credentials()
            if credentials is None:
                raise RuntimeError("no AWS credentials found (environment, profile or role)")
        self.region, self.service, self.credentials = region, service, credentials

    def sign(self, request: httpx.Request) -> httpx.Request:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        headers = {"host": request.url.netloc.decode()}
        if "content-type" in request.headers:
            headers["content-type"] = request.headers["content-type"]
        aws = AWSRequest(method=request.method, url=str(request.url), data=request.content, headers=headers)
        SigV4Auth(self.credentials.get_frozen_credentials(), self.service, self.region).add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in aws.headers:
                request.headers[name] = aws.headers[name]
        return request

    def auth_flow(self, request: httpx.Request):
        yield self.sign(request)


class SageMakerRuntime(SigV4):
    """Send an OpenAI-SDK request (``POST .../v1/<route>``) to a SageMaker endpoint's invocations URL,
    with ``route=<route>`` in ``X-Amzn-SageMaker-Custom-Attributes`` (adapters/sagemaker reads it)."""

    def __init__(self, endpoint: str, region: str, *, credentials=None, inference_component: str | None = None,
                 invocations_url: str | None = None) -> None:
        super().__init__(region, service="sagemaker", credentials=credentials)
        self.invocations_url = invocations_url or (
            f"https://runtime.sagemaker.{region}.amazonaws.com/endpoints/{endpoint}/invocations")
        self.inference_component = inference_component

    def auth_flow(self, request: httpx.Request):
        path = request.url.path
        if "/v1/" not in path:
            raise ValueError(f"expected an OpenAI-style path ending in /v1/<route>, got {path!r}")
        route = path.split("/v1/", 1)[1].strip("/")
        request.url = httpx.URL(self.invocations_url)
        request.headers["host"] = request.url.netloc.decode()
        request.headers["X-Amzn-SageMaker-Custom-Attributes"] = f"route={route}"
        if self.inference_component:
            request.headers["X-Amzn-SageMaker-Inference-Component"] = self.inference_component
        yield self.sign(request)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="target", required=True)
    url = sub.add_parser("url", help="a Lambda function URL with AWS_IAM auth")
    url.add_argument("url", help="the FunctionUrl output of the stack")
    sm = sub.add_parser("sagemaker", help="a SageMaker endpoint")
    sm.add_argument("endpoint")
    sm.add_argument("--inference-component", help="inference-component mode: the InferenceComponentName output")
    for p in (url, sm):
        p.add_argument("texts", nargs="+")
        p.add_argument("--model", default="all-MiniLM-L6-v2")
        p.add_argument("--region", help="default: read from the URL (url) or the AWS configuration")
    url.add_argument("--api-key", help="an app key (TESSERA_API_KEYS), sent as x-api-key")
    args = parser.parse_args(argv)
    from openai import OpenAI

    if args.target == "url":
        region = args.region or region_of(args.url)
        if not region:
            parser.error("cannot tell the region from the URL: pass --region")
        base, auth = args.url.rstrip("/") + "/v1", SigV4(region)
        headers = {"x-api-key": args.api_key} if args.api_key else None
    else:
        import botocore.session

        region = args.region or botocore.session.get_session().get_config_variable("region")
        if not region:
            parser.error("pass --region (or configure a default region)")
        base, headers = "https://sagemaker.invalid/v1", None
        auth = SageMakerRuntime(args.endpoint, region, inference_component=args.inference_component)
    client = OpenAI(base_url=base, api_key="unused", default_headers=headers, http_client=httpx.Client(auth=auth))
    result = client.embeddings.create(model=args.model, input=args.texts, encoding_format="float")
    for item in result.data:
        print(item.index, len(item.embedding), item.embedding[:4])
    return 0


if __name__ == "__main__":
    sys.exit(main())
