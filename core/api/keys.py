"""API keys: the key a request presents and its constant-time match against the configured keys. The
app's gate and the Lambda handler's early checks read the same headers through this one place."""

from __future__ import annotations

import hmac
from typing import Iterable


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A Bearer token wins; ``x-api-key`` / ``api-key`` otherwise (also when ``Authorization`` carries a
    SigV4 signature, as for AWS_IAM function URLs), whatever the order of the headers (names lower-case)."""
    bearer = api_key = b""
    for name, value in headers:
        if name == b"authorization":
            scheme, _, rest = value.partition(b" ")
            if scheme.lower() == b"bearer":
                bearer = rest.strip()
        elif name in (b"x-api-key", b"api-key"):
            api_key = value.strip()
    return bearer or api_key


class ApiKeys:
    """The configured keys; none configured: every request is allowed."""

    def __init__(self, keys: Iterable[str]):
        self.keys = [k.encode() for k in keys]

    def allow(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        if not self.keys:
            return True
        token = presented_key(headers)
        matched = False
        for key in self.keys:  # every key, in constant time: no early exit that leaks which key matched
            matched |= hmac.compare_digest(token, key)
        return matched
