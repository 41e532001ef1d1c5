"""Admission at the edge of the app, before any work: the request body must arrive in time, and on
shutdown unfinished requests get an answer in the error shape.

- :class:`BodyReader` reads the whole body first, within ``request_body_timeout_s`` (then 408) and
  ``max_request_bytes`` (then 413), and only then lets the request in. A client that announces a body
  and sends it slowly holds a socket, never an in-flight slot that legitimate requests need.
- :class:`Drainer` knows the requests in progress. When the shutdown grace runs out, it cancels those
  still unanswered and answers each 503 with ``Retry-After`` (the server's own last resort would send a
  plain-text 500), so a client can retry elsewhere. ``give_up`` is scheduled by the SIGTERM handler.
"""

from __future__ import annotations

import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.api.encode import dumps
from core.errors import NotReady, RequestTimeout, TesseraError, TooLarge


async def send_error(send: Send, error: TesseraError, *, close: bool = False) -> None:
    body = dumps(error.body())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyReader:
    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, self._too_large(), close=True)  # refused before a byte is read
            return
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout_s
        more = True
        disconnected: Message | None = None
        while more:
            remaining = deadline - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), max(remaining, 0.0))
            except TimeoutError:
                # the rest of the body is not coming in time: answer and close (its bytes would follow)
                await send_error(send, RequestTimeout(
                    f"the request body did not arrive within {self.timeout_s:g}s (request_body_timeout_s)"),
                    close=True)
                return
            if message["type"] == "http.disconnect":
                disconnected = message
                break
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await send_error(send, self._too_large(), close=True)
                return
            chunks.append(body)
            more = message.get("more_body", False)
        if disconnected is not None:
            return  # nobody is left to answer
        body = b"".join(chunks)
        await self.app(_json_if_sent_as_form(scope, body), _replay(body, receive), send)

    def _too_large(self) -> TooLarge:
        return TooLarge(f"request body exceeds {self.max_bytes} bytes", code="body_too_large")


#: what `curl -d` and some clients send with a JSON body: read as JSON when the body is a JSON document
_FORM_TYPES = (b"application/x-www-form-urlencoded", b"text/plain")


def _json_if_sent_as_form(scope: Scope, body: bytes) -> Scope:
    """A JSON object or array posted as ``application/x-www-form-urlencoded`` (``curl -d``'s default) or
    ``text/plain``: every route here takes JSON, so the body is read as what it is."""
    if not body or body.lstrip()[:1] not in (b"{", b"["):
        return scope
    headers = scope.get("headers", ())
    for i, (name, value) in enumerate(headers):
        if name == b"content-type" and value.split(b";")[0].strip().lower() in _FORM_TYPES:
            patched = list(headers)
            patched[i] = (b"content-type", b"application/json")
            return {**scope, "headers": patched}
    return scope


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then the client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class InProgress:
    """The requests in progress (their tasks), for :class:`Drainer` and the shutdown that gives up."""

    def __init__(self, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        self.giving_up = False
        self.active: dict[asyncio.Task, list[bool]] = {}  # request task → [response started]

    def give_up(self) -> int:
        """Cancel every request still without a response (each then answers 503). Returns how many."""
        self.giving_up = True
        pending = [t for t, started in self.active.items() if not started[0] and not t.done()]
        for t in pending:
            t.cancel()
        return len(pending)


class Drainer:
    def __init__(self, app: ASGIApp, *, in_progress: InProgress) -> None:
        self.app = app
        self.in_progress = in_progress

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        started = [False]
        active = self.in_progress.active
        active[task] = started

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                started[0] = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if not self.in_progress.giving_up or started[0]:
                raise
            task.uncancel()  # our own cancellation: answer instead of dying
            await send_error(send, NotReady("server is shutting down and the grace period ran out; retry on "
                                            "another instance", retry_after=self.in_progress.retry_after_s),
                             close=True)
        finally:
            active.pop(task, None)
