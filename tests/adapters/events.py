"""Lambda events in the shapes AWS sends (payload format 2.0), and a Lambda context object."""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field


def _request_context(method: str, path: str, *, route_key: str, domain: str, api_id: str) -> dict:
    now = time.time()
    return {
        "accountId": "123456789012",
        "apiId": api_id,
        "domainName": domain,
        "domainPrefix": api_id,
        "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "203.0.113.10",
                 "userAgent": "tessera-tests"},
        "requestId": str(uuid.uuid4()),
        "routeKey": route_key,
        "stage": "$default",
        "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
        "timeEpoch": int(now * 1000),
    }


def _body(body: bytes | None, base64_body: bool) -> tuple[str | None, bool]:
    if body is None:
        return None, False
    if base64_body:
        return base64.b64encode(body).decode(), True
    return body.decode(), False


def function_url_event(method: str, path: str, body: bytes | None = None, *, headers: dict | None = None,
                       query: str = "", base64_body: bool = False) -> dict:
    """A Lambda function URL invocation (payload 2.0; ``routeKey`` is always ``$default``)."""
    domain = "abcdefghijklmnopqrstuvwxyz123456.lambda-url.us-east-1.on.aws"
    text, is_b64 = _body(body, base64_body)
    event = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": {"host": domain, "user-agent": "tessera-tests", "x-amzn-trace-id": "Root=1-0-0",
                    "x-forwarded-proto": "https", "x-forwarded-port": "443", "x-forwarded-for": "203.0.113.10",
                    "accept": "*/*", **({"content-type": "application/json"} if body is not None else {}),
                    **(headers or {})},
        "requestContext": {**_request_context(method, path, route_key="$default", domain=domain,
                                              api_id="abcdefghijklmnopqrstuvwxyz123456"),
                           "authorizer": None},
        "isBase64Encoded": is_b64,
    }
    if text is not None:
        event["body"] = text
    return event


def http_api_event(method: str, path: str, body: bytes | None = None, *, headers: dict | None = None,
                   query: str = "", base64_body: bool = False) -> dict:
    """An API Gateway HTTP API proxy integration (payload 2.0) on an ``ANY /{proxy+}`` route."""
    domain = "a1b2c3d4e5.execute-api.us-east-1.amazonaws.com"
    text, is_b64 = _body(body, base64_body)
    event = {
        "version": "2.0",
        "routeKey": "ANY /{proxy+}",
        "rawPath": path,
        "rawQueryString": query,
        "headers": {"host": domain, "user-agent": "tessera-tests", "x-forwarded-proto": "https",
                    "x-forwarded-port": "443", "x-forwarded-for": "203.0.113.10",
                    **({"content-type": "application/json", "content-length": str(len(body))} if body is not None
                       else {}),
                    **(headers or {})},
        "requestContext": _request_context(method, path, route_key="ANY /{proxy+}", domain=domain,
                                           api_id="a1b2c3d4e5"),
        "pathParameters": {"proxy": path.lstrip("/")},
        "isBase64Encoded": is_b64,
    }
    if text is not None:
        event["body"] = text
    return event


EVENTS = {"function-url": function_url_event, "http-api": http_api_event}


@dataclass
class LambdaContext:
    function_name: str = "tessera"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 3008
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:tessera"
    log_group_name: str = "/aws/lambda/tessera"
    log_stream_name: str = "2026/01/01/[$LATEST]0"

    def get_remaining_time_in_millis(self) -> int:
        return 30_000
