"""The gate: what every HTTP request passes between the outer layers (request id, trace, CORS, prefixes) and its
route, as one ASGI layer. In order:

1. it joins the requests in progress (``core.api.admission.InProgress``: when the shutdown's grace runs out, an
   unanswered request is answered 503 with ``Retry-After``);
2. its whole body is read, in time and within size (``core.api.admission.BodyReader``: 408, 413), before it
   takes anything else;
3. the API key (``ApiKeys``: 401; the start-up warm pass, marked in its scope by an object only this process
   holds, needs none), then admission (:class:`InflightLimit`: draining 503, the in-flight cap 429) for all
   but the service paths, and one request-metrics observation per request that got this far;
4. the route; an exception nobody handled (a bug, never the answer to bad input) is answered 500 in the error
   shape here, and the connection stays usable. Starlette's own last resort (``ServerErrorMiddleware``, outside)
   answers 500 and then re-raises, so the server would close the keep-alive connection without a
   ``Connection: close`` header and the client's next request on it would fail with a reset. Only when the
   response had already started (headers sent) is there no way to answer, and the exception propagates so the
   server closes the connection, as it must.

Each step was a middleware of its own: on a one-text request, their coroutines and send wrappers cost more of the
server's CPU than the tokenizer does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from typing import Iterator

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.api.admission import BodyReader, InProgress, Progress, send_error
from core.api.common import dumps
from core.api.docs_ui import DOC_PATHS
from core.api.keys import ApiKeys
from core.api.paths import route_path
from core.api.warm_pass import is_warm_pass
from core.config import Settings
from core.errors import NotReady, Overloaded, TesseraError, Unauthorized
from core.metrics import Metrics
from core.request_context import note_error, note_rejection

log = logging.getLogger("tessera")

#: routes reachable without an API key: the probes (a platform's health check sends none); /metrics and the
#: documentation follow ``metrics_public`` / ``docs_public``
OPEN_PATHS = frozenset({"/health", "/ready"})
#: routes that are not work: no in-flight cap, still answered while draining
SERVICE_PATHS = frozenset({"/health", "/ready", "/metrics"})


def error_response(exc: TesseraError) -> Response:
    note_error(exc.code)
    return Response(dumps(exc.body()), status_code=exc.status, media_type="application/json", headers=exc.headers())


class InflightLimit:
    """Admission of API work: refused while the server drains (SIGTERM) and past the in-flight cap."""

    def __init__(self, settings: Settings, metrics: Metrics, state):
        self.max_inflight = settings.max_inflight_requests
        self.retry_after = settings.retry_after_s
        self.metrics = metrics
        self.state = state  # app.state: .draining is set on SIGTERM
        self.inflight = 0

    def refusal(self) -> TesseraError | None:
        if self.state.draining:
            note_rejection("draining")
            return NotReady("server is shutting down; retry on another instance")
        if self.inflight >= self.max_inflight:
            note_rejection("inflight_limit")
            return Overloaded(f"{self.inflight} requests in progress (limit {self.max_inflight}); retry later",
                              retry_after=self.retry_after)
        return None

    @contextmanager
    def held(self) -> Iterator[None]:
        """One in-flight slot for the duration (a request; or one record of a JSON Lines mini-batch, which
        runs as a request of its own inside the one that carried it)."""
        self.inflight += 1
        self.metrics.inflight.inc()
        try:
            yield
        finally:
            self.inflight -= 1
            self.metrics.inflight.dec()


class Gate:
    """The pure-ASGI layer in front of the routes (module docstring). ``in_progress``: the requests the shutdown
    may give up on; ``body``: the body's limits; ``health_paths``: a platform's own health checks, answered
    like ``/health``."""

    def __init__(self, app: ASGIApp, *, settings: Settings, metrics: Metrics, state, in_progress: InProgress,
                 body: BodyReader, health_paths: frozenset[str] = frozenset()):
        self.app = app
        self.in_progress = in_progress
        self.body = body
        self.keys = ApiKeys(settings.all_api_keys())
        self.open_paths = (OPEN_PATHS | health_paths | ({"/metrics"} if settings.metrics_public else set())
                           | (DOC_PATHS if settings.docs_public else set()))
        self.service_paths = SERVICE_PATHS | health_paths
        self.admission = InflightLimit(settings, metrics, state)
        state.inflight_limit = self.admission  # what a request's inner requests are admitted by (JSON Lines)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()  # the request's one loop lookup here: the body reader gets the task
        progress = Progress()
        active = self.in_progress.active
        active[task] = progress

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                progress.started = True
                progress.status = message["status"]
            await send(message)

        try:
            read = await self.body.read(scope, receive, tracked, task)
            if read is not None:
                await self._admitted(*read, tracked, progress)
        except asyncio.CancelledError:
            if not self.in_progress.giving_up or progress.started:
                raise
            task.uncancel()  # the shutdown's own cancellation: answer instead of dying
            await send_error(send, NotReady("server is shutting down and the grace period ran out; retry on "
                                            "another instance", retry_after=self.in_progress.retry_after_s),
                             close=True)
        finally:
            active.pop(task, None)

    async def _admitted(self, scope: Scope, receive: Receive, send: Send, progress: Progress) -> None:
        """Steps 3 and 4 (module docstring) for a request whose body has arrived."""
        started = time.perf_counter()
        try:
            path = route_path(scope)
            if (path not in self.open_paths and not self.keys.allow(scope.get("headers", ()))
                    and not is_warm_pass(scope)):
                await error_response(Unauthorized("missing or wrong API key (send 'Authorization: Bearer KEY')"))(
                    scope, receive, send
                )
                return
            if path in self.service_paths:
                await self._route(scope, receive, send, progress)
                return
            refusal = self.admission.refusal()
            if refusal is not None:
                await error_response(refusal)(scope, receive, send)
                return
            with self.admission.held():
                await self._route(scope, receive, send, progress)
        finally:
            route = scope.get("route")
            self.metrics.observe_request(getattr(route, "path", "unmatched"), progress.status if progress.started
                                         else 500, time.perf_counter() - started)

    async def _route(self, scope: Scope, receive: Receive, send: Send, progress: Progress) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - the one place that turns a bug into a response
            if progress.started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await send_error(send, TesseraError(f"internal error ({type(exc).__name__})"))
