"""``create_app(settings)``: the one FastAPI app every surface serves (local, Lambda, SageMaker, Modal)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import sys
import threading
import time
from contextlib import asynccontextmanager
from typing import Callable, Iterable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from core.api.admission import BodyReader, InProgress, JsonShape
from core.api.cors import Cors
from core.api.docs_ui import add_offline_docs
from core.api.gate import Gate, error_response
from core.api.hot_routes import HotRoutes
from core.api.observability import Observability, Tracing
from core.api.paths import Prefixes
from core.api.features import router
from core.api.response_limit import ResponseLimit
from core.api.warm_pass import WarmRequest, registry_requests, warm_app
from core.collector import tune_for_serving
from core.config import Settings
from core.engine import Registry
from core.errors import (
    ConfigError,
    HttpStatus,
    InvalidInput,
    MethodNotAllowed,
    NotFound,
    TesseraError,
    ValidationFailed,
)
from core.metrics import Metrics
from core.serving import ServingContext
from core.tracing import NO_TRACER, NoTracer, OtelTracer

log = logging.getLogger("tessera")

#: FastAPI ≥ 0.16x opens its own OpenTelemetry span, metrics and log records per request once a provider is
#: configured, and checks the providers on every request even when none is: the trace is Tracing's
#: (core.api.observability) and the metrics are Tessera's own, so FastAPI's are turned off where it has them
_NATIVE_TELEMETRY_OFF = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {}
)


def _validation_error(exc: RequestValidationError, content_type: str | None = None) -> TesseraError:
    errors = exc.errors()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if not loc and first.get("type") in ("model_attributes_type", "dict_type") and isinstance(first.get("input"), bytes):
        return InvalidInput(f"the request body must be a JSON object: send it with Content-Type: application/json "
                            f"(got Content-Type: {content_type or 'none'})", code="invalid_json")
    if first.get("type") == "json_invalid":
        return InvalidInput(f"request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".strip(),
                            code="invalid_json")
    param = ".".join(loc) or None
    message = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}" for e in errors[:5]
    )
    return ValidationFailed(message or "request does not match the schema", param=param)


def body_parse_error(cause: BaseException) -> InvalidInput:
    """What FastAPI's JSON reading raised beyond a JSONDecodeError: bytes that are not UTF-8 (or a
    compressed body), an integer past Python's digit limit, nesting past the recursion limit."""
    if isinstance(cause, UnicodeDecodeError):
        reason = f"it is not UTF-8 text ({cause.reason} at byte {cause.start}); send uncompressed UTF-8 JSON"
    elif isinstance(cause, RecursionError):
        reason = "it is nested too deeply"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        reason = "it holds an integer with thousands of digits"
    else:
        reason = str(cause)[:200]
    return InvalidInput(f"request body is not valid JSON: {reason}", code="invalid_json")


def startup_failure_line(exc: BaseException) -> str:
    """Why the start failed, in one line (the server logs it, and an entry point prints it last before it exits):
    a Tessera error's own message, anything else as ``Type: message`` (its traceback is logged before it)."""
    if isinstance(exc, ConfigError):
        from core.config import config_error_line

        return f"start-up failed: {config_error_line(exc)}"
    if isinstance(exc, TesseraError):
        return f"start-up failed: {exc.message}"
    if not isinstance(exc, OSError):  # a bug, not a condition of the machine: where it happened matters
        log.error("start-up failed", exc_info=exc)
    return f"start-up failed: {type(exc).__name__}: {exc}"


class _FailedStart:
    """The ASGI app in place of a middleware stack that could not be built: the lifespan's start-up fails
    with the reason in one line (the server exits), and a request (a server that runs no lifespan) raises it."""

    def __init__(self, app: FastAPI, exc: Exception):
        self.app, self.exc = app, exc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()
            self.app.state.startup_failure = startup_failure_line(self.exc)
            await send({"type": "lifespan.startup.failed", "message": self.app.state.startup_failure})
        raise self.exc


class _Tessera(FastAPI):
    """FastAPI whose start-up failure reaches the server as one line, wherever it happens: while the lifespan
    runs (Starlette would send the whole traceback as the message) or while the middleware stack is built
    ahead of it (which uvicorn's ``lifespan="auto"`` would take for an app without a lifespan, and serve 500s).
    The line is kept as ``state.startup_failure`` for the entry point to print last."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.router.lifespan = self._one_line_failure(self.router.lifespan)

    def build_middleware_stack(self) -> ASGIApp:
        try:
            return super().build_middleware_stack()
        except Exception as exc:  # noqa: BLE001 - any failure here is the start's: reported, then raised
            return _FailedStart(self, exc)

    def _one_line_failure(self, lifespan):
        async def run(scope: Scope, receive: Receive, send: Send) -> None:
            async def reporting(message) -> None:
                if message["type"] == "lifespan.startup.failed":  # sent from Starlette's except block
                    self.state.startup_failure = startup_failure_line(sys.exc_info()[1])
                    message = {**message, "message": self.state.startup_failure}
                await send(message)

            await lifespan(scope, receive, reporting)

        return run


def drain_on_sigterm(state, on_term: Callable[[], None] | None = None) -> Callable[[], None]:
    """Chain a SIGTERM handler that marks the app draining (new work → 503) and calls ``on_term``, ahead of
    the server's own (uvicorn's, which stops accepting connections and lets in-flight requests finish).
    Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame):
        state.draining = True
        if on_term is not None:
            on_term()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)

    return restore


def create_app(settings: Settings, registry: Registry | None = None, *, metrics: Metrics | None = None,
               health_paths: Iterable[str] = (), fail_unusable: bool = True,
               tracer: NoTracer | OtelTracer = NO_TRACER,
               warm_requests: Callable[[Registry], list[WarmRequest]] = registry_requests,
               response_limit: ResponseLimit | None = None,
               time_left: Callable[[Scope], float | None] | None = None) -> FastAPI:
    """Build the app. With ``registry`` given (Lambda: built at init), the lifespan only starts batchers;
    otherwise the lifespan loads the models from ``settings`` in a worker thread. ``health_paths``: a
    platform's own health checks (added by its adapter), answered like ``/health``: without an API key,
    outside the in-flight cap, while draining. ``fail_unusable``: the start-up fails when the models
    cannot be served as asked (``Registry.raise_if_unusable``); False for a platform whose health check
    keeps an unready server out of rotation (SageMaker: ``/ping`` answers 503 naming the failures). ``tracer``: ``core.tracing.tracer_from_env(environ)``
    at the edge (the app shuts it down, exporting what is buffered, when it stops). ``warm_requests``: what the
    lifespan sends through the app before it serves (``core.api.warm_pass``; an adapter adds its own routes),
    so that the first real request finds every route family warm. ``response_limit``: a platform's cap on an
    answer's size (``core.api.response_limit``: Lambda, SageMaker). ``time_left``: the seconds the platform
    still gives a request (from its scope; None: no limit of its own), which caps the request's deadline as an
    ``X-Request-Timeout`` does (Lambda: the invocation's remaining time less a margin)."""
    metrics = metrics or Metrics()
    in_progress = InProgress(retry_after_s=settings.retry_after_s)
    grace = settings.shutdown_grace_s

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if app.state.registry is None:
            app.state.registry = await asyncio.to_thread(Registry.from_settings, settings, metrics, tracer)
        if fail_unusable:
            app.state.registry.raise_if_unusable()  # no model loaded (or one failed, unless allow_degraded): exit
        await app.state.registry.start()
        # before the server listens (uvicorn runs the lifespan's start-up first): nothing reaches /ready before it
        await warm_app(app, warm_requests(app.state.registry), metrics, prefix=settings.url_prefix)
        loop = asyncio.get_running_loop()
        term_at: list[float] = []

        def on_term() -> None:  # in the signal handler: schedule, do nothing else here
            term_at.append(time.monotonic())
            # answer what is unfinished just before the server's own grace ends (it would send plain 500s)
            give_up_in = max(0.0, grace - min(1.0, grace / 10))
            loop.call_soon_threadsafe(loop.call_later, give_up_in, in_progress.give_up)

        restore = drain_on_sigterm(app.state, on_term)
        restore_collector = tune_for_serving()
        try:
            yield
        finally:
            restore_collector()
            app.state.draining = True
            restore()
            # the grace counts from SIGTERM: what the connections used of it, the batchers do not get again
            left = grace if not term_at else max(0.0, term_at[0] + grace - time.monotonic())
            await app.state.registry.stop(drain=left > 0, timeout=left)
            await app.state.serving.close()
            tracer.shutdown()

    app = _Tessera(
        title="Tessera",
        version="0.1.0",
        summary="OpenAI-compatible embeddings, reranking and classification",
        lifespan=lifespan,
        default_response_class=Response,
        docs_url=None,  # served offline instead (core.api.docs_ui)
        redoc_url=None,
        **_NATIVE_TELEMETRY_OFF,
    )
    add_offline_docs(app, app.title)
    app.state.settings = settings
    app.state.startup_failure = None  # why the lifespan's start-up failed, in one line (_Tessera)
    app.state.registry = registry
    app.state.metrics = metrics
    app.state.draining = False
    app.state.response_limit = response_limit
    app.state.time_left = time_left
    #: what the routes call: request → engine → result (reads the registry the lifespan loads)
    app.state.serving = ServingContext(settings, lambda: app.state.registry, metrics=metrics)
    app.include_router(router)

    @app.exception_handler(TesseraError)
    async def _tessera_error(request: Request, exc: TesseraError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(_validation_error(exc, request.headers.get("content-type")))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body
            return error_response(body_parse_error(exc.__cause__))
        if exc.status_code == 404:
            return error_response(NotFound(f"no route {request.method} {request.url.path}"))
        if exc.status_code == 405:
            return error_response(MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}"))
        return error_response(HttpStatus(str(exc.detail), status=exc.status_code))

    # innermost: the plain JSON routes without FastAPI's routing, dependency and exception layers (the rest to them)
    app.add_middleware(HotRoutes, fastapi=app, router=router)
    # in progress (drain), the whole body read, the API key and the in-flight cap, the last guard: one layer
    # (core.api.gate; it answers a bug inside Starlette's last resort, which would drop the connection)
    body = BodyReader(max_bytes=settings.max_request_bytes, timeout_s=settings.request_body_timeout_s,
                      shape=JsonShape(max_items=settings.max_items_per_request,
                                      max_tokens=settings.max_tokens_per_request))
    app.add_middleware(Gate, settings=settings, metrics=metrics, state=app.state, in_progress=in_progress, body=body,
                       health_paths=frozenset(health_paths))
    # outside the admission: paths, CORS preflights (no API key), the trace, the request id on every answer
    if settings.root_path or settings.url_prefix:
        app.add_middleware(Prefixes, root_path=settings.root_path, url_prefix=settings.url_prefix)
    if settings.cors_origins:
        app.add_middleware(Cors, origins=settings.cors_origins)
    if tracer.enabled:
        app.add_middleware(Tracing, tracer=tracer)
    app.add_middleware(Observability, metrics=metrics, access=settings.access_log)
    return app
