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
from dataclasses import dataclass
from typing import Any

import numpy as np
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


#: how deep any request's JSON may nest. The deepest schema nests 6 levels (a chat message's image part:
#: body → messages → message → content → part → image_url); the bound is generous, well below the parsers'
#: own (orjson's 1,024, Python's recursion limit) so that no parser, validator or walk over a body recurses far
MAX_JSON_DEPTH = 64
#: bodies up to this size are measured on the event loop (microseconds); larger ones on a worker thread
INLINE_SHAPE_BYTES = 64 * 1024
#: bodies larger than this are decoded on a worker thread (:func:`decode_json`)
DECODE_OFF_LOOP_BYTES = 256 * 1024
#: the byte scan's stride for the nesting depth (the running depth of one stride at a time)
_DEPTH_STRIDE = 1 << 16
_QUOTE, _COMMA, _DOT = ord('"'), ord(","), ord(".")
_OPENERS, _CLOSERS, _LITERALS = (ord("["), ord("{")), (ord("]"), ord("}")), (ord("t"), ord("f"), ord("n"))


@dataclass(frozen=True, slots=True)
class JsonStructure:
    """What a JSON body holds outside its strings, counted without parsing it (:func:`json_structure`)."""

    strings: int
    containers: int  # arrays and objects
    commas: int
    scalars: int  # floats (their ``.``) and literals (true, false, null: their first letter)
    numbers: int  # runs of digits (a float counts twice)
    deeper: bool  # nests more than MAX_JSON_DEPTH levels somewhere


def json_structure(body: bytes) -> JsonStructure:
    """One linear scan of ``body``'s bytes (numpy: its loops release the GIL). Escapes are blanked first
    (``\\\\`` pairs, then ``\\"``: in JSON a backslash only occurs inside a string), so the remaining
    quotes delimit the strings exactly and a bracket, comma or digit inside a string is never counted. For a
    body that is not valid JSON the figures are an estimate, and its parser refuses it anyway."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"  ").replace(b'\\"', b"  ")
    raw = np.frombuffer(body, dtype=np.uint8)
    quotes = np.flatnonzero(raw == _QUOTE)
    bare = raw if not quotes.size else np.where(_inside_strings(quotes, raw.size), 0, raw)
    opens = (bare == _OPENERS[0]) | (bare == _OPENERS[1])
    closes = (bare == _CLOSERS[0]) | (bare == _CLOSERS[1])
    digits = (bare - np.uint8(ord("0"))) < 10
    scalars = np.count_nonzero(bare == _DOT) + sum(int(np.count_nonzero(bare == c)) for c in _LITERALS)
    numbers = int(np.count_nonzero(digits[1:] & ~digits[:-1])) + int(digits[:1].sum())
    return JsonStructure(strings=(quotes.size + 1) // 2, containers=int(np.count_nonzero(opens)),
                         commas=int(np.count_nonzero(bare == _COMMA)), scalars=int(scalars), numbers=numbers,
                         deeper=_deeper_than(opens, closes, MAX_JSON_DEPTH))


def _inside_strings(quotes: np.ndarray, size: int) -> np.ndarray:
    """A mask of the bytes inside strings (their quotes included), from the positions of the unescaped quotes:
    string ``i`` runs from quote ``2i`` to quote ``2i + 1`` (an unterminated last string, to the end)."""
    starts, ends = quotes[0::2], quotes[1::2] + 1
    if ends.size < starts.size:
        ends = np.append(ends, size)
    cuts = np.empty(2 * starts.size, dtype=np.int64)
    cuts[0::2], cuts[1::2] = starts, ends
    runs = np.diff(cuts, prepend=0, append=size)  # outside, inside, outside, …, outside
    inside = np.zeros(runs.size, dtype=bool)
    inside[1::2] = True
    return np.repeat(inside, runs)


def _deeper_than(opens: np.ndarray, closes: np.ndarray, limit: int) -> bool:
    """Whether the running nesting depth passes ``limit`` anywhere (stride by stride: it stops at the first
    stride that does, and holds one stride's depths at a time)."""
    steps = opens.view(np.int8) - closes.view(np.int8)
    depth = 0
    for start in range(0, steps.size, _DEPTH_STRIDE):
        moves = steps[start:start + _DEPTH_STRIDE]
        moves = moves[moves != 0]
        if not moves.size:
            continue
        levels = np.cumsum(moves, dtype=np.int32)
        if depth + int(levels.max()) > limit:
            return True
        depth += int(levels[-1])
    return False


class JsonShape:
    """How deep a JSON body may nest and how many values it may hold before any parser sees it. Parsing a
    wide document (``{"input": [[]] * 2600000}``, 7.8 MB) or a deep one (8,000 lists nested 500 deep, 8 MB:
    4M lists, 3.6 s and +700 MB) held the event loop for seconds before any limit could refuse it; no valid
    request nests deeper than :data:`MAX_JSON_DEPTH` or holds more values than its limits allow, so a body past
    either is refused first: too deep, 400 ``invalid_json``; too many values, 413 ``too_many_values``.

    The body is measured by one byte scan (:func:`json_structure`: strings told apart exactly, so brackets in a
    text never count), on the event loop for a small body and on a worker thread for a large one, and only
    when a cheap count says it could be past a bound (enough separators or openings in its raw bytes)."""

    def __init__(self, *, max_items: int, max_tokens: int) -> None:
        #: values other than integers (strings, lists, objects, floats, literals): texts, documents, pairs
        self.max_values = 16 * max_items + 1024
        #: integers: token ids (and span bounds)
        self.max_ints = max_tokens + 4 * max_items

    def could_exceed(self, body: bytes) -> bool:
        """A cheap count of the raw bytes (strings included, so it can only over-count): False when the body
        cannot be past a bound."""
        return (body.count(b",") >= min(self.max_values, self.max_ints)
                or body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH)

    async def refusal(self, body: bytes) -> TesseraError | None:
        """:meth:`problem`, on a worker thread for a body over :data:`INLINE_SHAPE_BYTES`."""
        if len(body) <= INLINE_SHAPE_BYTES:
            return self.problem(body) if self.could_exceed(body) else None
        return await asyncio.to_thread(self.problem, body)

    def problem(self, body: bytes) -> TesseraError | None:
        """The refusal for a body nested deeper or holding more values than any request may, else None."""
        if not self.could_exceed(body):
            return None
        shape = json_structure(body)
        if shape.deeper:
            return InvalidInput(f"request body is not accepted: it nests JSON more than {MAX_JSON_DEPTH} levels deep, "
                                "deeper than any request", code="invalid_json")
        # width: every value but the first of a container follows a comma (an object's keys are not counted);
        # depth: every array and object is a value, commas or not
        values = max(min(shape.strings + shape.containers + shape.scalars, shape.commas + 1), shape.containers)
        if values <= self.max_values and shape.numbers <= self.max_ints:
            return None
        return TooLarge(f"the request body holds about {values} JSON values and {shape.numbers} integers; no request "
                        f"within this server's limits holds more than {self.max_values} values or {self.max_ints} "
                        "integers (from max_items_per_request and max_tokens_per_request)", code="too_many_values")


async def decode_json(body: bytes) -> Any:
    """``orjson.loads(body)``, on a worker thread for a body over :data:`DECODE_OFF_LOOP_BYTES` (its shape is
    bounded already: the gate's :class:`JsonShape`)."""
    if len(body) > DECODE_OFF_LOOP_BYTES:
        return await asyncio.to_thread(orjson.loads, body)
    return orjson.loads(body)


async def decode_json_object(body: bytes) -> dict[str, Any]:
    """:func:`json_object`, decoded on a worker thread for a large body."""
    if len(body) > DECODE_OFF_LOOP_BYTES:
        return await asyncio.to_thread(json_object, body)
    return json_object(body)


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
        if self.shape is not None:
            refusal = await self.shape.refusal(body)
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
