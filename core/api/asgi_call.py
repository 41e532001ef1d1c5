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


@dataclass(slots=True)
class InProcess:
    typed_result: bool = False  # the caller asks for the route's typed result, unencoded
    result: Any = None  # where the route puts it


@dataclass(slots=True)
class Answer:
    status: int | None  # None: the app sent no response start
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = field(default=b"", repr=False)
    result: Any = None  # the route's typed result, when asked for and the route has one


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
    scope.update(method=method, path=path, raw_path=path.encode(), query_string=b"",
                 extensions=dict(outer.get("extensions") or {}))
    return scope


class _Client:
    """The client side of one in-process request: the body in one message, then a disconnect once the answer is
    complete or the client of the carrying request has gone; the answer's messages collected."""

    __slots__ = ("body", "delivered", "gone", "waiters", "answer", "chunks")

    def __init__(self, body: bytes) -> None:
        self.body, self.delivered, self.gone = body, False, False
        self.waiters: list[asyncio.Future] = []
        self.answer, self.chunks = Answer(None), []

    async def receive(self) -> Message:
        if not self.delivered:
            self.delivered = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        if not self.gone:  # one future per wait: a watcher cancelled while it waits cancels only its own
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            await waiter
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.answer.status, self.answer.headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                self.leave()

    def leave(self, _: Any = None) -> None:
        if not self.gone:
            self.gone = True
            for waiter in self.waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self.waiters.clear()


async def call(app: ASGIApp, scope: Scope, body: bytes = b"", *, content_type: bytes | None = None,
               disconnected: asyncio.Future | None = None, typed_result: bool = False) -> Answer:
    """Send one request through ``app`` (an app, or its router for a request already past the middleware).
    ``scope``: one of :func:`new_scope` or :func:`inner_scope` (its own, completed here): its
    ``content-length`` is set to the body's (and ``content-type`` to ``content_type`` when given).
    ``disconnected``: done when the client of the request that carries this one has gone."""
    dropped = (b"content-length", b"content-type") if content_type is not None else (b"content-length",)
    headers = [(k, v) for k, v in scope.get("headers", ()) if k not in dropped]
    if content_type is not None:
        headers.append((b"content-type", content_type))
    if body or content_type is not None:
        headers.append((b"content-length", str(len(body)).encode()))
    caller = InProcess(typed_result)
    scope["headers"] = headers
    scope["extensions"][IN_PROCESS] = caller
    client = _Client(body)
    if disconnected is not None:
        disconnected.add_done_callback(client.leave)
    try:
        await app(scope, client.receive, client.send)
    finally:
        client.leave()
        if disconnected is not None:
            disconnected.remove_done_callback(client.leave)
    answer = client.answer
    answer.body, answer.result = b"".join(client.chunks), caller.result
    return answer
