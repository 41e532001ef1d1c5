"""ASGI middleware for surfaces that run no lifespan: start the batchers inside the running loop.

Mangum with ``lifespan="off"`` (Lambda) never sends the lifespan events that start the batchers in
``create_app``; this wrapper starts them on the first request, in the loop Mangum keeps for the life
of the execution environment, so they persist across invocations."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class StartBatchers:
    def __init__(self, app: ASGIApp, registry) -> None:
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.registry.ensure_started()
        await self.app(scope, receive, send)
