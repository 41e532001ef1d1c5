"""What the route modules share of HTTP (not a router): the serving context of the app, the request's
deadline, cancellation when the client goes away (the one disconnect watcher, :func:`wait_for_disconnect`),
JSON bytes responses, and a route's answer handed to an in-process caller unencoded (:func:`answer`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Coroutine, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.types import Receive

from core.api.admission import decode_json_object
from core.api.asgi_call import in_process
from core.api.common import dumps
from core.errors import ClientClosed, InvalidInput
from core.serving import Served, ServingContext

TIMEOUT_HEADER = "x-request-timeout"
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class JSONBytes(Response):
    media_type = "application/json"


def serving_of(request: Request) -> ServingContext:
    return request.app.state.serving


def model_choice(request: Request) -> str | None:
    """TEI's routes carry no ``model`` field: with several models served, ``?model=NAME`` (or an
    ``X-Model: NAME`` header) picks one."""
    return request.query_params.get("model") or request.headers.get("x-model")


def deadline_for(request: Request, serving: ServingContext) -> float:
    """The request's deadline: the server's timeout, shortened by an ``X-Request-Timeout`` header (seconds) and
    by the time the platform still gives the request (``create_app(time_left=...)``: Lambda's invocation)."""
    timeout = serving.settings.request_timeout_s
    header = _header(request.scope, _TIMEOUT_NAME)
    if header is not None:
        try:
            asked = float(header)
        except ValueError:
            raise InvalidInput(f"{TIMEOUT_HEADER} must be a number of seconds, got {header!r}") from None
        if not asked > 0:
            raise InvalidInput(f"{TIMEOUT_HEADER} must be positive, got {header!r}")
        timeout = min(timeout, asked)
    time_left = getattr(request.app.state, "time_left", None)
    left = time_left(request.scope) if time_left is not None else None
    if left is not None:
        timeout = min(timeout, max(left, 0.001))
    return time.monotonic() + timeout


_TIMEOUT_NAME = TIMEOUT_HEADER.encode("latin-1")


def _header(scope, name: bytes) -> str | None:
    """A request header's value, read from the scope as Starlette's ``Headers`` reads it (names arrive lowercased),
    without making that object and its failed lookups' exceptions on every request."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


async def read_json_object(request: Request) -> dict[str, Any]:
    """A route that chooses its schema from the body (TEI's ``/``): the body as a JSON object (decoded on a
    worker thread when it is large)."""
    return await decode_json_object(await request.body())


def validated(schema: type[M], body: dict[str, Any]) -> M:
    """``body`` as ``schema``; a mismatch answers like any route's (422 in the error shape)."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone (its ``http.disconnect``), reading a request's receive channel after its
    body: a route's watcher (:func:`until_disconnect`), or SageMaker's for the requests that one carries."""
    while (await receive())["type"] != "http.disconnect":
        pass


#: seconds a request's work runs before a watcher starts reading its receive channel for the client's leaving:
#: work done sooner (most of it, on a server that keeps up) costs no watcher task at all
WATCH_AFTER_S = 0.05


async def until_disconnect(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` (a task of its own); if the client disconnects first, cancel it (its queued items are then
    dropped) and raise ``ClientClosed``. The watcher starts once the work has run ``WATCH_AFTER_S``."""
    # the loop looked up once: on Python 3.11 each lookup (get_running_loop, current_task, ensure_future,
    # create_task) makes a getpid() system call (~0.2 µs; five were made)
    loop = asyncio.get_running_loop()
    task = loop.create_task(work)
    watcher: asyncio.Future | None = None
    left = False

    def on_disconnect(done: asyncio.Future) -> None:
        nonlocal left
        if not done.cancelled() and done.exception() is None and not task.done():
            left = True
            task.cancel()

    def watch() -> None:
        nonlocal watcher
        if not task.done():
            watcher = loop.create_task(wait_for_disconnect(request.receive))
            watcher.add_done_callback(on_disconnect)

    timer = loop.call_later(WATCH_AFTER_S, watch)
    try:
        return await task  # the request's own cancellation (shutdown gave up on it) cancels the work with it
    except asyncio.CancelledError:
        if not left:
            raise
        raise ClientClosed("client disconnected") from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


def answer(request: Request, served: Served, encode: Callable[[], Any]) -> Response:
    """A route's answer: ``encode()`` as JSON; or, to an in-process caller that asked for the typed result
    (``core.api.asgi_call``: SageMaker's ``application/x-npy``), ``served`` itself, unencoded, with an empty 200."""
    caller = in_process(request.scope)
    if caller is None or not caller.typed_result:
        return JSONBytes(dumps(encode()))
    caller.result = served
    return Response(status_code=200)
