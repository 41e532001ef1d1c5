#!/usr/bin/env python
"""Call a Tessera Lambda function URL that uses ``AWS_IAM`` auth, with the OpenAI SDK, signing each
request with SigV4 (botocore) through an ``httpx.Auth``.

    python scripts/function_url_client.py https://ID.lambda-url.REGION.on.aws "text" ["text" ...]
        [--model all-MiniLM-L6-v2] [--api-key KEY] [--region REGION]

Credentials come from the usual boto3 chain (environment, profile, instance role); the caller needs
``lambda:InvokeFunctionUrl`` and ``lambda:InvokeFunction`` on the function (alias). Under IAM auth the
``Authorization`` header carries the signature, so an app API key (``TESSERA_API_KEYS``) goes in
``x-api-key`` instead. In your own code::

    from openai import OpenAI
    import httpx
    client = OpenAI(base_url=URL + "/v1", api_key="unused",
                    http_client=httpx.Client(auth=SigV4(region="us-east-1")))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the FunctionUrl output of the stack")
    parser.add_argument("texts", nargs="+")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--api-key", help="an app key (TESSERA_API_KEYS), sent as x-api-key")
    parser.add_argument("--region", help="default: read from the URL")
    args = parser.parse_args(argv)
    region = args.region or region_of(args.url)
    if not region:
        parser.error("cannot tell the region from the URL: pass --region")
    from openai import OpenAI

    headers = {"x-api-key": args.api_key} if args.api_key else None
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", default_headers=headers,
                    http_client=httpx.Client(auth=SigV4(region)))
    result = client.embeddings.create(model=args.model, input=args.texts, encoding_format="float")
    for item in result.data:
        print(item.index, len(item.embedding), item.embedding[:4])
    return 0


if __name__ == "__main__":
    sys.exit(main())
