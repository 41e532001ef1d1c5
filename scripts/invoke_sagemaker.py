#!/usr/bin/env python
"""Call a Tessera SageMaker endpoint with boto3's ``sagemaker-runtime`` ``invoke_endpoint``.

    python scripts/invoke_sagemaker.py ENDPOINT "first text" "second text" [--route embeddings]
        [--model NAME] [--npy] [--region us-east-1]
    python scripts/invoke_sagemaker.py ENDPOINT --json '{"query": "q", "documents": ["a", "b"]}' --route rerank

The body is the same JSON as the HTTP API's; the route (and optionally the model) travel in
``CustomAttributes`` (``route=embeddings,model=NAME``). ``--npy`` asks for ``application/x-npy``
(embeddings only): a float32 (n, d) array instead of JSON. Needs the [sagemaker] extra (boto3) and AWS
credentials.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import Any

JSON = "application/json"
NPY = "application/x-npy"


def request_params(endpoint: str, body: dict[str, Any], *, route: str = "embeddings", model: str | None = None,
                   npy: bool = False, inference_component: str | None = None) -> dict[str, Any]:
    """The ``invoke_endpoint`` keyword arguments for one request."""
    attributes = ",".join(f"{key}={value}" for key, value in (("route", route), ("model", model)) if value)
    extra = {"InferenceComponentName": inference_component} if inference_component else {}
    return {**extra,
        "EndpointName": endpoint,
        "Body": json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"),
        "ContentType": JSON,
        "Accept": NPY if npy else JSON,
        "CustomAttributes": attributes,
    }


def decode(response: dict[str, Any]):
    """The endpoint's answer: the OpenAI-shaped JSON as a dict, or a numpy array for ``application/x-npy``."""
    data = response["Body"].read()
    if response.get("ContentType", "").startswith(NPY):
        import numpy as np

        return np.load(io.BytesIO(data), allow_pickle=False)
    return json.loads(data)


def invoke(client, endpoint: str, body: dict[str, Any], **options):
    return decode(client.invoke_endpoint(**request_params(endpoint, body, **options)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("endpoint")
    parser.add_argument("texts", nargs="*", help="inputs for /v1/embeddings")
    parser.add_argument("--json", help="a full request body (for any route) instead of texts")
    parser.add_argument("--route", default="embeddings")
    parser.add_argument("--model")
    parser.add_argument("--npy", action="store_true", help="ask for application/x-npy (embeddings)")
    parser.add_argument("--region")
    parser.add_argument("--inference-component", help="endpoints in inference-component mode (infra/sagemaker)")
    args = parser.parse_args(argv)
    if not args.json and not args.texts:
        parser.error("give texts or --json")
    import boto3
    from botocore.exceptions import ClientError

    body = json.loads(args.json) if args.json else {"input": args.texts}
    client = boto3.client("sagemaker-runtime", region_name=args.region)
    try:
        result = invoke(client, args.endpoint, body, route=args.route, model=args.model, npy=args.npy,
                        inference_component=args.inference_component)
    except ClientError as exc:  # ModelError carries the container's status and error body
        error = exc.response.get("Error", {})
        print(f"{error.get('Code')}: status {exc.response.get('OriginalStatusCode')}: {error.get('Message')}",
              file=sys.stderr)
        return 1
    if hasattr(result, "shape"):
        print(f"array {result.shape} {result.dtype}")
    else:
        print(json.dumps(result)[:2000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
