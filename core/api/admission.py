"""Admission at the edge of the app, before any work: the request body must arrive in time, and on
shutdown unfinished requests get an answer in the error shape. The gate (``core.api.gate``) runs both.

- :class:`BodyReader` reads the whole body first, within ``request_body_timeout_s`` (then 408) and
  ``max_request_bytes`` (then 413), and only then lets the request in. A client that announces a body
  and sends it slowly holds a socket, never an in-flight slot that legitimate requests need.
- :class:`InProgress` knows the requests in progress. When the shutdown grace runs out, it cancels those
  still unanswered and the gate answers each 503 with ``Retry-After`` (the server's own last resort would send
  a plain-text 500), so a client can retry elsewhere. ``give_up`` is scheduled by the SIGTERM handler.
"""
from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from core.api.common import dumps
from core.errors import InvalidInput, RequestTimeout, TesseraError, TooLarge
from core.request_context import note_error


async def send_error(send: Send, error: TesseraError, *, close: bool = False) -> None:
    note_error(error.code)
    body = dumps(error.body())
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def json_object(body: bytes) -> dict[str, Any]:
    """A body that must be one JSON object, decoded: the body of a route that picks its schema from it (TEI's
    ``/``), of SageMaker's ``/invocations`` and of each of its JSON Lines records. Anything else is a 400."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidInput("the request body must be a JSON object", code="invalid_json")
    return data


#: a JSON string (escapes included), matched in linear time
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_DIGIT_RUNS = bytes(0x31 if 0x30 <= i <= 0x39 else 0x30 for i in range(256))


class JsonShape:
    """How many values a JSON body may hold before any schema sees it. Parsing and validating a wide
    document (``{"input": [[]] * 2600000}``, 7.8 MB) held the event loop for seconds before the item
    limit could refuse it; no valid request holds more values than its limits allow, so a body past them is
    refused first. The values are counted without parsing (strings blanked by one regular expression, then
    brackets, separators and literals counted: C loops, tens of milliseconds for 8 MB, on a worker thread),
    and only for a body with enough separators to possibly be past the bound (a cheap count on the loop)."""

    def __init__(self, *, max_items: int, max_tokens: int) -> None:
        #: values other than integers (strings, lists, objects, floats, literals): texts, documents, pairs
        self.max_values = 16 * max_items + 1024
        #: integers: token ids (and span bounds)
        self.max_ints = max_tokens + 4 * max_items

    def could_exceed(self, body: bytes) -> bool:
        return body.count(b",") >= min(self.max_values, self.max_ints)

    def problem(self, body: bytes) -> TooLarge | None:
        """The refusal for a body holding more values than any request may, else None."""
        bare = _JSON_STRING.sub(b'""', body)
        containers = bare.count(b"[") + bare.count(b"{")
        values = (bare.count(b'"') // 2 + containers + bare.count(b".") + bare.count(b"true") + bare.count(b"false")
                  + bare.count(b"null"))
        digits = bare.translate(_DIGIT_RUNS)  # each digit → "1", anything else → "0"
        numbers = digits.count(b"01") + digits.startswith(b"1")  # runs of digits (a float counts twice)
        # width, not depth: every value but the first of a container follows a comma (a deeply nested body
        # is left to the parser, which refuses it as too deep)
        values = min(values, bare.count(b",") + 1)
        if values <= self.max_values and numbers <= self.max_ints:
            return None
        return TooLarge(f"the request body holds about {values} JSON values and {numbers} integers; no request within "
                        f"this server's limits holds more than {self.max_values} values or {self.max_ints} integers "
                        "(from max_items_per_request and max_tokens_per_request)", code="too_many_values")


class BodyReader:
    """A request's whole body, read before it takes anything else (the gate's second step, ``core.api.gate``)."""

    def __init__(self, *, max_bytes: int, timeout_s: float, shape: JsonShape | None = None) -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.shape = shape

    async def read(self, scope: Scope, receive: Receive, send: Send,
                   task: asyncio.Task) -> tuple[Scope, Receive] | None:
        """The request to go on with, its body read: the scope (a JSON body sent as a form is JSON) and a
        receive channel that gives the body again, then the client's own messages. None: the request was
        answered here (408, 413), or its client left before its body arrived. ``task``: the task reading it
        (the caller's own, which it holds: on Python 3.11 looking it up again is a system call)."""
        declared = next((v for k, v in scope.get("headers", ()) if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, self._too_large(), close=True)  # refused before a byte is read
            return None
        chunks: list[bytes] = []
        size = 0
        more = True
        disconnected = too_large = False
        # one deadline for the whole body: a timer that cancels the reading (asyncio.timeout's context manager
        # costs ~3 µs more per request; asyncio.wait_for would make a task per message)
        cancelling = task.cancelling()
        expired = _Expiry(task)
        timer = task.get_loop().call_later(self.timeout_s, expired)
        try:
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    break
                body = message.get("body", b"")
                size += len(body)
                if size > self.max_bytes:
                    too_large = True
                    break
                chunks.append(body)
                more = message.get("more_body", False)
        except asyncio.CancelledError:
            if not expired.fired or task.uncancel() > cancelling:
                raise  # not (only) the deadline: a cancellation of the task's own
            # the rest of the body is not coming in time: answer and close (its bytes would follow)
            await send_error(send, RequestTimeout(
                f"the request body did not arrive within {self.timeout_s:g}s (request_body_timeout_s)"),
                close=True)
            return None
        finally:
            timer.cancel()
        if too_large:
            await send_error(send, self._too_large(), close=True)
            return None
        if disconnected:
            return None  # nobody is left to answer
        body = b"".join(chunks)
        if self.shape is not None and self.shape.could_exceed(body):
            refusal = await asyncio.to_thread(self.shape.problem, body)
            if refusal is not None:
                await send_error(send, refusal)
                return None
        return _json_if_sent_as_form(scope, body), replay_body(body, receive)

    def _too_large(self) -> TooLarge:
        return TooLarge(f"request body exceeds {self.max_bytes} bytes", code="body_too_large")


class _Expiry:
    """The body's deadline: cancels the task reading it, and remembers that it did (a cancellation of the
    task's own, such as the shutdown giving up on it, is not a late body)."""

    __slots__ = ("task", "fired")

    def __init__(self, task: asyncio.Task) -> None:
        self.task = task
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        self.task.cancel()


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


def replay_body(body: bytes, receive: Receive) -> Receive:
    """The body already read, as one message; then the client's own messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class Progress:
    """How far a request's answer has got: started (its headers sent) and with which status."""

    __slots__ = ("started", "status")

    def __init__(self) -> None:
        self.started = False
        self.status = 0


class InProgress:
    """The requests in progress (their tasks), for the gate (``core.api.gate``) and the shutdown that gives up."""

    def __init__(self, *, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        self.giving_up = False
        self.active: dict[asyncio.Task, Progress] = {}  # request task → how far its answer has got

    def give_up(self) -> int:
        """Cancel every request still without a response (each then answers 503). Returns how many."""
        self.giving_up = True
        pending = [t for t, progress in self.active.items() if not progress.started and not t.done()]
        for t in pending:
            t.cancel()
        return len(pending)
