"""CORS by allow-list (``cors_origins``): browsers on the listed origins may call the API.

- A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) from a listed origin
  is answered here, 204, before the API-key gate (browsers send preflights without credentials), with
  the methods and the headers clients send (``authorization``, ``content-type``, ``x-api-key``, ...).
- From an unlisted origin, the preflight gets 403 in the error shape and no CORS header; an actual
  request still runs (the browser, not the server, withholds the answer) but its origin is never echoed.
- Responses to listed origins carry ``Access-Control-Allow-Origin`` (the origin itself, or ``*`` when
  the list holds ``*``), ``Vary: Origin`` and the exposed ``X-Request-Id`` / ``Retry-After``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.api.admission import send_error
from core.errors import TesseraError

ALLOW_METHODS = b"GET, POST, OPTIONS"
#: always allowed; a listed origin's preflight also gets the headers it asks for (SDKs add their own,
#: e.g. OpenAI's x-stainless-*)
ALLOW_HEADERS = b"authorization, content-type, x-api-key, api-key, x-request-id, traceparent, tracestate"
EXPOSE_HEADERS = b"x-request-id, retry-after"
MAX_AGE = b"600"


class OriginRefused(TesseraError):
    status, type, code = 403, "invalid_request_error", "cors_origin_not_allowed"


class Cors:
    def __init__(self, app: ASGIApp, *, origins: list[str]) -> None:
        self.app = app
        self.any = "*" in origins
        self.origins = frozenset(o.encode() for o in origins if o != "*")

    def _allowed(self, origin: bytes) -> bool:
        return self.any or origin.rstrip(b"/").lower() in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = preflight = None
        asked = b""
        for name, value in scope.get("headers", ()):
            if name == b"origin":
                origin = value
            elif name == b"access-control-request-method":
                preflight = value
            elif name == b"access-control-request-headers":
                asked = value
        if origin is None:
            await self.app(scope, receive, send)
            return
        allowed = self._allowed(origin)
        allow_origin = b"*" if self.any else origin
        if scope.get("method") == "OPTIONS" and preflight is not None:
            if not allowed:
                await send_error(send, OriginRefused("this origin is not in the server's CORS allow-list "
                                                     "(cors_origins)"))
                return
            await send({"type": "http.response.start", "status": 204, "headers": [
                (b"access-control-allow-origin", allow_origin), (b"access-control-allow-methods", ALLOW_METHODS),
                (b"access-control-allow-headers", _headers(asked)), (b"access-control-max-age", MAX_AGE),
                (b"vary", b"Origin"), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if not allowed:
            await self.app(scope, receive, send)
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if not h[0].lower().startswith(b"access-control-")]
                headers += [(b"access-control-allow-origin", allow_origin),
                            (b"access-control-expose-headers", EXPOSE_HEADERS), (b"vary", b"Origin")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_cors)


def _headers(asked: bytes) -> bytes:
    """The always-allowed headers plus the asked ones (header names only: token characters)."""
    names = [n.strip().lower() for n in asked.split(b",")]
    extra = [n for n in names if n and len(n) <= 64 and n.replace(b"-", b"").replace(b"_", b"").isalnum()
             and n not in ALLOW_HEADERS.split(b", ")]
    return b", ".join([ALLOW_HEADERS, *extra]) if extra else ALLOW_HEADERS
