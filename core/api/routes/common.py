"""Helpers shared by the route modules: deadlines, disconnect handling, JSON bytes responses."""

from __future__ import annotations

import asyncio
import time

from fastapi import Request
from fastapi.responses import Response

from core.config import Settings
from core.engine import Registry
from core.errors import InvalidInput, NotReady, TesseraError

TIMEOUT_HEADER = "x-request-timeout"


class ClientClosed(TesseraError):
    """The client went away before its answer was ready (nginx's 499); nobody reads this response."""

    status, type, code = 499, "invalid_request_error", "client_closed_request"


class JSONBytes(Response):
    media_type = "application/json"


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def registry_of(request: Request) -> Registry:
    registry = request.app.state.registry
    if registry is None:
        raise NotReady("models are still loading")
    return registry


def deadline_for(request: Request, settings: Settings) -> float:
    """The request's deadline: the server's timeout, shortened by an ``X-Request-Timeout`` header (seconds)."""
    timeout = settings.request_timeout_s
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


async def serve_until_disconnect(request: Request, work):
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
