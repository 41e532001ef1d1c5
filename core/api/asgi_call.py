"""One HTTP request through an ASGI app in this process, without a socket: the start-up warm pass
(``core.api.warm_pass``) and SageMaker's ``/invocations`` (which runs the app's route for the request it
carries) both send theirs with :func:`call`.

- The body is delivered in one message; afterwards the caller's client counts as connected until the
  answer is complete or ``disconnected`` is set (the real client of the request that carries this one
  has gone), whichever comes first: a route's disconnect watcher sees what the caller's would.
- The scope carries an :class:`InProcess` (:func:`in_process`): the caller takes the answer, and applies a
  platform's limits to what it finally sends itself (the app's early response-size check leaves it alone).
- ``typed_result=True``: a route that has a typed result (a ``Served``) hands it to the caller instead of
  encoding it (``core.api.http.answer``; ``Answer.result``), so an adapter that answers in another format
  (SageMaker's ``application/x-npy``) takes the arrays as they are, with no JSON or base64 in between.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Scope

#: in a scope's ``extensions``: the :class:`InProcess` of a request sent with :func:`call`
IN_PROCESS = "tessera.in_process"
#: what an inner request does not inherit from the scope of the request that carries it (the router's findings)
_ROUTED = ("route", "endpoint", "path_params")


@dataclass
class InProcess:
    typed_result: bool = False  # the caller asks for the route's typed result, unencoded
    result: Any = None  # where the route puts it


@dataclass
class Answer:
    status: int | None  # None: the app sent no response start
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = field(default=b"", repr=False)
    result: Any = None  # the route's typed result, when asked for and the route has one

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


def in_process(scope: Scope) -> InProcess | None:
    """The in-process caller of this request (None: a client of the server)."""
    extensions = scope.get("extensions")
    return extensions.get(IN_PROCESS) if extensions else None


def new_scope(method: str, path: str, headers=(), *, extensions: dict | None = None) -> Scope:
    """A request's scope with nothing inherited (the warm pass's): no client, no server."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": list(headers), "client": None, "server": None,
        "state": {}, "extensions": dict(extensions or {}),
    }


def inner_scope(outer: Scope, method: str, path: str) -> Scope:
    """The scope of a request carried by ``outer`` (its client, headers, state and request id), at ``path``."""
    scope = {k: v for k, v in outer.items() if k not in _ROUTED}
    scope.update(method=method, path=path, raw_path=path.encode(), query_string=b"")
    return scope


async def call(app: ASGIApp, scope: Scope, body: bytes = b"", *, content_type: bytes | None = None,
               disconnected: asyncio.Future | None = None, typed_result: bool = False) -> Answer:
    """Send one request through ``app`` (an app, or its router for a request already past the middleware).
    ``scope``'s ``content-length`` is set to the body's (and ``content-type`` to ``content_type`` when given).
    ``disconnected``: done when the client of the request that carries this one has gone."""
    dropped = (b"content-length", b"content-type") if content_type is not None else (b"content-length",)
    headers = [(k, v) for k, v in scope.get("headers", ()) if k not in dropped]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    if body or content_type is not None:
        headers.append((b"content-length", str(len(body)).encode()))
    caller = InProcess(typed_result)
    scope = {**scope, "headers": headers, "extensions": {**(scope.get("extensions") or {}), IN_PROCESS: caller}}
    #: done once the answer is complete or the carrying request's client has gone: the client's disconnect
    gone = asyncio.get_running_loop().create_future()

    def client_gone(_=None) -> None:
        if not gone.done():
            gone.set_result(None)

    if disconnected is not None:
        disconnected.add_done_callback(client_gone)
    delivered = False
    answer = Answer(None)
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.shield(gone)  # a watcher cancelled while it waits leaves ``gone`` as it is
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.status, answer.headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                client_gone()

    try:
        await app(scope, receive, send)
    finally:
        client_gone()
        if disconnected is not None:
            disconnected.remove_done_callback(client_gone)
        answer.body = b"".join(chunks)
        answer.result = caller.result
    return answer
