"""The last guard: an exception no handler expected (a bug, never the answer to bad input) still ends in
a response in the error shape, and the connection stays usable.

Starlette's own last resort (``ServerErrorMiddleware``) answers 500 and then re-raises, so the server
closes the keep-alive connection without a ``Connection: close`` header and the client's next request on
it fails with a reset. This middleware sits inside it: it logs the traceback, answers the 500 itself and
swallows the exception. Only when the response had already started (headers sent) is there no way to
answer, and the exception propagates so the server closes the connection, as it must."""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.api.admission import send_error
from core.errors import TesseraError

log = logging.getLogger("tessera")


class UnhandledErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - the one place that turns a bug into a response
            if started:
                raise
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await send_error(send, TesseraError(f"internal error ({type(exc).__name__})"))
