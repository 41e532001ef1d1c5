"""The app's warm pass: one request per route family through the whole ASGI stack, in-process, before the
server serves.

The model's own warm-up (``Engine.warm_up``) runs every batch shape through the backend; what it leaves
to the first request is the app's first pass over a route: FastAPI's first look at the endpoint, the
request model's validation, the serving path, the batcher's inference thread (started on its first
batch), the response encoders (float lists, base64), the metrics' label series, and modules imported on
first use (the image and audio decoders of a multi-modal model). :func:`warm_app` sends those requests
through the app as an ASGI call (no socket, nothing reachable from outside):

- before ``/ready`` can answer: from the lifespan, which uvicorn (local server, SageMaker, Modal) runs to
  its end before it listens, and from the Lambda handler's init;
- without an API key: the request's scope carries :data:`WARM_PASS`, an object only this process holds
  (no client can put an object in an ASGI scope), which the key gate accepts and the access log skips;
- uncounted: the metrics are muted while it runs (``Metrics.muted``), so ``/metrics`` shows no request
  and no batch from it (the label series it touches exist, at 0).

An answer other than 2xx is logged and the start-up goes on: the models have already loaded and passed
their own warm-up, so a failed warm request costs the first real request its first-pass time, never the
service. An exception that escapes the app is not caught: the app answers its own errors, so one that
escapes is a bug every request would meet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson
from starlette.types import ASGIApp, Scope

from core.api import asgi_call
from core.api.asgi_call import new_scope

from core.api.features import warm_bodies

log = logging.getLogger("tessera.warm_pass")

#: in the scope's ``extensions`` of a warm-pass request; compared by identity, so only this process can send one
WARM_PASS = object()
_EXTENSION = "tessera.warm_pass"
#: the most one warm request may take before it is given up (logged, not fatal)
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class WarmRequest:
    method: str
    path: str  # the route, without any url_prefix
    body: dict[str, Any] | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    label: str = ""


@dataclass
class WarmResult:
    request: WarmRequest
    status: int | None  # None: no answer within REQUEST_TIMEOUT_S
    seconds: float
    answer: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def is_warm_pass(scope: Scope) -> bool:
    return scope.get("extensions", {}).get(_EXTENSION) is WARM_PASS


def requests_for(name: str, capabilities: Iterable[str], modalities: Iterable[str]) -> list[WarmRequest]:
    """The warm requests of one served model: those its task's features declare (core/api/features.py; one per
    route family: embeddings both as float lists and as base64, and once per input modality), the auxiliary
    routes left out."""
    return [WarmRequest("POST", route, body, label=f"{name}: {label}")
            for route, label, body in warm_bodies(name, capabilities, modalities)]


def registry_requests(registry) -> list[WarmRequest]:
    """The warm requests of every loaded model."""
    out: list[WarmRequest] = []
    for name, engine in registry.engines.items():
        out.extend(requests_for(name, engine.task.capabilities, engine.task.modalities))
    return out


def scope_of(request: WarmRequest, prefix: str = "") -> Scope:
    """The request's scope, marked as the warm pass's (:data:`WARM_PASS`)."""
    return new_scope(request.method, prefix + request.path, [(b"host", b"warm-pass"), *request.headers],
                     extensions={_EXTENSION: WARM_PASS})


async def call(app: ASGIApp, request: WarmRequest, *, prefix: str = "") -> WarmResult:
    """One request through ``app`` (``core.api.asgi_call``); the client stays connected until the answer is sent."""
    body = orjson.dumps(request.body) if request.body is not None else b""
    json_type = b"application/json" if request.body is not None else None
    started = time.perf_counter()
    try:
        answer = await asyncio.wait_for(asgi_call.call(app, scope_of(request, prefix), body, content_type=json_type),
                                        REQUEST_TIMEOUT_S)
    except asyncio.TimeoutError:
        return WarmResult(request, None, time.perf_counter() - started)
    return WarmResult(request, answer.status, time.perf_counter() - started, answer.body)


async def warm_app(app: ASGIApp, requests: list[WarmRequest], metrics, *, prefix: str = "") -> list[WarmResult]:
    """Send ``requests`` through ``app`` one after another with ``metrics`` muted; log the outcome."""
    started = time.perf_counter()
    results = []
    with metrics.muted():
        for request in requests:
            result = await call(app, request, prefix=prefix)
            results.append(result)
            if not result.ok:
                answer = result.answer[:300].decode(errors="replace")
                log.warning("warm pass: %s %s (%s) answered %s: %s; its first real request pays its first-pass time",
                            request.method, request.path, request.label,
                            result.status if result.status is not None else f"nothing in {REQUEST_TIMEOUT_S:.0f}s",
                            answer)
    if results:
        log.info("warm pass: %d of %d requests answered 2xx in %.3fs", sum(r.ok for r in results), len(results),
                 time.perf_counter() - started)
    return results

