"""What the route modules share of HTTP (not a router): the serving context of the app, the request's
deadline, cancellation when the client goes away, JSON bytes responses."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, TypeVar

from fastapi import Request
from fastapi.responses import Response

from core.api.serving import Serving
from core.errors import ClientClosed, InvalidInput

TIMEOUT_HEADER = "x-request-timeout"
T = TypeVar("T")


class JSONBytes(Response):
    media_type = "application/json"


def serving_of(request: Request) -> Serving:
    return request.app.state.serving


def deadline_for(request: Request, serving: Serving) -> float:
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
