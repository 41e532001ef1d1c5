"""Serving under a path: ``root_path`` (a proxy strips it before forwarding) and ``url_prefix`` (every
route is mounted under it: the client's path holds it, as Infinity's ``--url-prefix``).

:class:`Prefixes` sets the ASGI ``root_path`` to the server's own root path + ``root_path`` +
``url_prefix`` and ``path`` to that + the route, as a Starlette ``Mount`` would: routing then matches
the route alone, and FastAPI's ``/docs`` and OpenAPI ``servers`` carry the full prefix the client sees.
A path outside ``url_prefix`` is answered 404 in the error shape. Inner code that needs the route
(the open paths of the API-key gate) reads :func:`route_path`."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from core.api.admission import send_error
from core.errors import NotFound


def route_path(scope: Scope) -> str:
    """``path`` without ``root_path`` (what the router matches)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root):] or "/"
    return path


class Prefixes:
    def __init__(self, app: ASGIApp, *, root_path: str = "", url_prefix: str = "") -> None:
        self.app = app
        self.root_path = root_path
        self.url_prefix = url_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        server_root = scope.get("root_path", "")
        rest = route_path(scope)
        # the server may already have been given our root path (uvicorn --root-path): not twice
        if self.root_path and server_root.endswith(self.root_path):
            server_root = server_root[: -len(self.root_path)]
        prefix = self.url_prefix
        if prefix:
            if not (rest == prefix or rest.startswith(prefix + "/")):
                if scope["type"] == "http":
                    await send_error(send, NotFound(f"no route {scope.get('method')} {rest}: every route is "
                                                    f"under {prefix}/ (url_prefix)"))
                return
            rest = rest[len(prefix):] or "/"
        root = server_root + self.root_path + prefix
        scope["root_path"], scope["path"] = root, root + rest  # in place, as a Mount: outer layers see the route
        await self.app(scope, receive, send)
