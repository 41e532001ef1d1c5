"""What the route modules share of HTTP (not a router): the serving context of the app, the request's
deadline, cancellation when the client goes away, JSON bytes responses."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, TypeVar

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from core.errors import ClientClosed, InvalidInput
from core.serving import ServingContext

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
    """The request's deadline: the server's timeout, shortened by an ``X-Request-Timeout`` header (seconds)."""
    timeout = serving.settings.request_timeout_s
    header = request.headers.get(TIMEOUT_HEADER)
    if header is not None:
        try:
            asked = float(header)
        except ValueError:
            raise InvalidInput(f"{TIMEOUT_HEADER} must be a number of seconds, got {header!r}") from None
        if not asked > 0:
            raise InvalidInput(f"{TIMEOUT_HEADER} must be positive, got {header!r}")
        timeout = min(timeout, asked)
    return time.monotonic() + timeout


async def read_json_object(request: Request) -> dict[str, Any]:
    """A route that chooses its schema from the body (TEI's ``/``): the body as a JSON object."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object", code="invalid_json")
    return body


def validated(schema: type[M], body: dict[str, Any]) -> M:
    """``body`` as ``schema``; a mismatch answers like any route's (422 in the error shape)."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it (its queued items are then dropped)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the request itself is cancelled (shutdown gave up on it): so is its work
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientClosed("client disconnected")
    return task.result()
