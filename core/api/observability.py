"""The outermost middleware: request ids, the access log line and refusal metrics (:class:`Observability`),
and, with tracing on, the request's span (:class:`Tracing`).

- ``X-Request-Id``: the caller's, kept to the characters in :data:`SAFE` and :data:`MAX_REQUEST_ID`
  characters, or a new one (32 hex digits); echoed on every response, errors and refusals included,
  and carried by the request's log lines and span.
- One access line per request (logger ``tessera.access``): method, route, path, status, duration,
  request id, model, inputs and tokens. Never input text, never a key (no header is logged).
- ``tessera_rejected_requests_total{reason}``: each refusal (401, 408, 413, 429, 503, 504) by reason.

The start-up warm pass (``core.api.warm_pass``) gets no access line.
"""

from __future__ import annotations

import logging
import random
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core import request_context
from core.api.warm_pass import is_warm_pass
from core.logs import sole_handler
from core.metrics import Metrics
from core.request_context import RequestRecord

access_log = logging.getLogger("tessera.access")

MAX_REQUEST_ID = 128
#: what a request id keeps of the caller's value (others are dropped): safe in headers, logs and URLs
SAFE = re.compile(rb"[^A-Za-z0-9._:=+/@-]")

#: statuses that are refusals, counted by reason
REFUSALS = frozenset({401, 408, 413, 429, 503, 504})
#: reason of a refusal by its error code (a reason noted by whoever refused wins)
REASONS = {
    "overloaded": "queue_full",
    "deadline_exceeded": "timeout",
    "request_timeout": "body_timeout",
    "invalid_api_key": "unauthorized",
}


def request_id(headers) -> str:
    """The caller's ``X-Request-Id`` made safe, or a new id when it sent none (or nothing safe).

    A new id is 128 bits, 32 hex digits, from the ``random`` module's generator: seeded from the system's
    entropy at start, and again in a forked child by the module itself. An id is a label, not a secret, and
    ``os.urandom`` is a system call that lets go of the interpreter lock: on a loop shared with the tokenization
    and inference threads, getting it back cost more than the rest of the request's bookkeeping (~35 µs CPU per
    request against ~1 µs, near-free model, in-process)."""
    for name, value in headers:
        if name == b"x-request-id":
            cleaned = SAFE.sub(b"", value[: MAX_REQUEST_ID * 4])[:MAX_REQUEST_ID]
            if cleaned:
                return cleaned.decode("ascii")
            break
    return f"{random.getrandbits(128):032x}"


def route_of(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "path", None) or "unmatched"


class Observability:
    def __init__(self, app: ASGIApp, *, metrics: Metrics, access: bool = True) -> None:
        self.app = app
        self.metrics = metrics
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope.get("path")  # as the client sent it (inner layers may move a prefix into root_path)
        rid = request_id(scope.get("headers", ()))
        scope.setdefault("state", {})["request_id"] = rid  # request.state.request_id
        record = RequestRecord(rid)
        token = request_context.current.set(record)
        id_header = (b"x-request-id", rid.encode("ascii"))
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", ()) if h[0].lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, id_header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            try:
                if status in REFUSALS:
                    code = record.error_code or str(status)
                    self.metrics.count_rejection(record.reason or REASONS.get(code, code))
                if self.access and not is_warm_pass(scope):
                    self._log(scope, path, record, status, time.perf_counter() - started)
            finally:
                request_context.current.reset(token)

    @staticmethod
    def _log(scope: Scope, path: str | None, record: RequestRecord, status: int, seconds: float) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        route = route_of(scope)
        fields = {
            "method": scope.get("method"), "route": route, "path": path,
            "status": status or None,  # None: the client left before any answer
            "duration_ms": round(seconds * 1000, 2), "request_id": record.request_id,
            "model": record.model, "inputs": record.inputs, "tokens": record.tokens,
        }
        if record.error_code:
            fields["error"] = record.error_code
        if record.cache_hits is not None:
            fields["cache_hits"], fields["cache_misses"] = record.cache_hits, record.cache_misses
        args = (scope.get("method"), route, status or "-")
        # where only the server's own handler listens, the line it would write, without a LogRecord and the
        # logging machinery's walk (~15% of a one-text request's CPU through the app)
        handler = sole_handler(access_log, logging.INFO)
        line = None if handler is None else handler.formatter.line(time.time(), logging.INFO, access_log.name,
                                                                   "%s %s %s" % args, fields)
        if line is not None:
            handler.write_line(line)
            return
        # logger.info's path, without its walk up the stack for the caller's file and line
        access_log.handle(access_log.makeRecord(access_log.name, logging.INFO, __file__, _ACCESS_LINE, "%s %s %s",
                                                args, None, "_log", {"fields": fields}))


#: the line an access record names as its source (where ``_log`` starts)
_ACCESS_LINE = Observability._log.__code__.co_firstlineno


class Tracing:
    """The request's SERVER span, joined to the caller's ``traceparent``: its route, model, status,
    request id, inputs and tokens. Installed only when tracing is on."""

    def __init__(self, app: ASGIApp, *, tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracer = self.tracer
        method = scope.get("method", "")
        record = request_context.current.get()
        attributes = {"http.request.method": method, "url.path": scope.get("path", ""),  # before any prefix move
                      "url.scheme": scope.get("scheme", "http")}
        if record is not None:
            attributes["tessera.request_id"] = record.request_id
        status = 0

        async def tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with tracer.server_span(method, tracer.extract(scope.get("headers", ())), attributes) as span:
            try:
                await self.app(scope, receive, tracked)
            finally:
                route = scope.get("route")
                if route is not None:
                    span.update_name(f"{method} {route.path}")
                    span.set_attribute("http.route", route.path)
                if status:
                    span.set_attribute("http.response.status_code", status)
                if record is not None:
                    if record.model is not None:
                        span.set_attribute("tessera.model", record.model)
                    span.set_attribute("tessera.inputs", record.inputs)
                    span.set_attribute("tessera.tokens", record.tokens)
                    if record.error_code:
                        span.set_attribute("error.type", record.error_code)
                if not status or status >= 500:
                    tracer.fail(span, str(status or "no response"))
