"""One front-end process of a server with several (``core.supervisor`` starts it: ``python -m core.api.frontend``).

It reads the supervisor's hand-off (``core.supervisor.Handoff``, JSON on stdin), asks to die with the
supervisor, builds the app with the surface's factory (``extra["app"]``, ``module:function``; default
:func:`tessera_app`) and serves it with uvicorn on the inherited listening socket. Each answer carries
``X-Tessera-Frontend: <index>``, so a client (and the tests) can tell the front ends apart. It exits 0 after a
drain (SIGTERM: stop accepting, finish what is in flight within ``shutdown_grace_s``), 3 when the app could not
start (as ``uvicorn`` does).

A front end started again (``handoff.restart``: the one before it died) sends its warm pass
(``core.api.warm_pass``) with a short deadline (:data:`RESTART_WARM_WAIT_S` per request): the executors are
warm and busy with the other front ends' traffic, and a warm request queued behind it (one model's queue is
shared by every front end) held the restarted front end back from serving for as long as the queue took to
drain (14 s of a 21 s restart, measured under load). Past its deadline a warm request is answered 504 and the
start goes on; the code paths up to the queue are warm by then.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import signal
import socket
import sys
from pathlib import Path

log = logging.getLogger("tessera.frontend")

#: how long each warm request of a front end started again may wait on the executors (``X-Request-Timeout``)
RESTART_WARM_WAIT_S = 0.5


class FrontendHeader:
    """Adds ``X-Tessera-Frontend: <index>`` to every HTTP answer (pure ASGI; the lifespan passes through)."""

    def __init__(self, app, index: int):
        self.app = app
        self.header = (b"x-tessera-frontend", str(index).encode())

    def __getattr__(self, name):  # .state, .router ...: the app's
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = self.header

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_header)


def tessera_app(settings, handoff):
    """The app of ``python -m core serve``'s front ends: the models are the executors' (``handoff.executors``)."""
    from core.api.app import create_app
    from core.metrics import Metrics
    from core.tracing import tracer_from_env

    metrics = Metrics()
    tracer = tracer_from_env(os.environ)
    from core.executor import remote_registry

    registry = remote_registry(settings, handoff.executors, metrics=metrics, tracer=tracer)
    return create_app(settings, registry, metrics=metrics, tracer=tracer, warm_requests=warm_requests_for(handoff))


def warm_requests_for(handoff, requests=None):
    """The warm pass of this front end (``requests``: the app's, by default ``registry_requests``): as it is at
    the server's start, each request with a deadline of :data:`RESTART_WARM_WAIT_S` in a front end started again
    (the module's docstring says why)."""
    from core.api.http import TIMEOUT_HEADER
    from core.api.warm_pass import registry_requests

    requests = requests or registry_requests
    if not handoff.restart:
        return requests
    deadline = (TIMEOUT_HEADER.encode(), str(RESTART_WARM_WAIT_S).encode())

    def bounded(registry):
        return [dataclasses.replace(r, headers=(*r.headers, deadline)) for r in requests(registry)]

    return bounded


def metrics_peers(app, handoff):
    """``/metrics`` answers for the whole server (``core.executor.metrics``): the app's ``metrics_peers`` are
    the other front ends and the executors, found in the run directory."""
    if getattr(app.state, "metrics", None) is None:
        return None
    from core.executor.client import read_address
    from core.executor.metrics import Peers

    sockets = {device: entry["socket"] for device, entry in read_address(handoff.executors)["executors"].items()}
    app.state.metrics_peers = Peers(handoff.executors, handoff.index, int(handoff.plan["count"]), sockets)
    return app.state.metrics_peers


def command_and_environment() -> tuple[list[str], dict[str, str]]:
    """The front end's command line, and its environment: this one, with the folder holding ``core`` first on
    ``PYTHONPATH`` (a surface may run from elsewhere, e.g. SageMaker's ``serve`` from ``/``)."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
    return [sys.executable, "-m", "core.api.frontend"], env


def serve_with_frontends(settings, plan, *, extra: dict | None = None) -> int:
    """Serve with ``plan.count`` front ends: the supervisor (``core.supervisor``) binds the port, starts one
    executor per device (``core.executor.ExecutorSet``) and the front ends; returns the exit status.
    ``extra``: the surface's own (``settings``: its Settings class, ``app``: its app factory, ``uvicorn``:
    more ``uvicorn.Config`` keywords), as ``module:name`` strings."""
    from core.executor import ExecutorSet
    from core.supervisor import Supervisor

    command, env = command_and_environment()
    return Supervisor(settings, plan, command, executors=ExecutorSet.start, extra=extra, env=env).run()


def _resolve(name: str):
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def main() -> int:
    from core.supervisor import Handoff, die_with_parent

    handoff = Handoff.read(sys.stdin)
    die_with_parent(handoff.parent)
    import uvicorn

    from core.api.http_limits import http_options
    from core.frontends import FrontendPlan
    from core.logs import configure_logging, uvicorn_log_options
    from core.supervisor import signal_ready

    settings_class = _resolve(handoff.extra.get("settings", "core.config:Settings"))
    settings = settings_class.model_validate(handoff.settings)
    configure_logging(settings.log_level, fmt=settings.log_format)
    if handoff.restart:
        log.info("front end %d started again (%s): its warm pass waits at most %.1f s a request on the executors",
                 handoff.index, handoff.restart, RESTART_WARM_WAIT_S)
    app = _resolve(handoff.extra.get("app", "core.api.frontend:tessera_app"))(settings, handoff)
    app.state.frontends = FrontendPlan(**handoff.plan)
    peers = metrics_peers(app, handoff)
    listener = socket.socket(fileno=handoff.fd)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started and not self.should_exit:
                if peers is not None:  # the other front ends gather this one's metrics here
                    from core.executor.metrics import frontend_socket, serve_exposition

                    self.metrics_server = await serve_exposition(frontend_socket(peers.run_dir, handoff.index),
                                                                 app.state.metrics.render)
                signal_ready(handoff)

    config = uvicorn.Config(FrontendHeader(app, handoff.index), loop="auto", access_log=False, lifespan="on",
                            log_level=settings.log_level.lower(), timeout_graceful_shutdown=math.ceil(
                                settings.shutdown_grace_s), **http_options(settings.max_header_bytes),
                            **uvicorn_log_options(settings.log_format), **handoff.extra.get("uvicorn", {}))
    # uvicorn raises the signal that stopped it again once it has drained: here that is the end, status 0
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    server = Server(config)
    server.run(sockets=[listener])
    return 0 if server.started else 3


if __name__ == "__main__":
    sys.exit(main())
