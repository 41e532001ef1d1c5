"""``GET /ping`` and ``POST /invocations`` added to the app that ``create_app`` builds.

``/invocations`` does not re-implement any route: it picks the target route, then runs the request's
body through the app's own router at that path (``/v1/<route>``) in-process (``core.api.asgi_call``, as
the start-up warm pass does), so validation, limits, batching and error rendering are those of the HTTP
API, and a route added to ``core.api.features`` is reachable here without a change. The body goes as it
came, unless the custom attributes name a model that the body does not (it is then added).

- Route: ``X-Amzn-SageMaker-Custom-Attributes: route=rerank`` (pairs separated by ``,`` or ``;``),
  else a ``"route"`` field in the JSON body, else the default route given to :func:`install`, else
  the one main capability the served models share (a single embedding model: ``embeddings``;
  auxiliary ones such as ``tokenize`` are not counted).
- Model: the body's ``model``, else ``model=NAME`` in the custom attributes.
- ``Content-Type``: JSON (415 otherwise). ``Accept``: JSON, or ``application/x-npy`` for embeddings:
  a float32 ``(n, d)`` array in NumPy's ``.npy`` format (406 for anything else), written from the route's
  own arrays (the route hands its result over unencoded: no JSON or base64 in between).
- ``Content-Type: application/jsonlines`` (Batch Transform's ``SplitType=Line``, ``MultiRecord``): one
  request per line, answered as one JSON line per record, in order; a failed record answers its error
  object on its own line (adapters/sagemaker/jsonlines.py).
- Response size: the app's response limit (``core.api.response_limit``), ``max_response_bytes``
  (SageMaker's real-time limit, 6 MB, by default; 0 turns the guard off, as a Batch Transform job may):
  an answer over it is replaced by a 413 in the error shape, which names the ways out (fewer inputs,
  ``application/x-npy``, base64, Batch Transform), instead of the opaque failure SageMaker would hand
  the caller. It counts what ``/invocations`` sends: after the work for one request (its ``.npy`` or
  JSON), before any record runs for a JSON Lines mini-batch of embeddings whose answer cannot fit.
- ``/ping`` answers as ``/ready`` does: 200 once every model is loaded and healthy, 503 when not.
- ``GET /execution-parameters`` (asked by Batch Transform when the job leaves them unset): MultiRecord,
  payload size within the request limit.
- Start-up: the app's warm pass covers ``/invocations`` too (:func:`warm_requests`), before ``/ping`` can answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from typing import Any, Callable

import numpy as np
import orjson
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response

from adapters.sagemaker.models import SAGEMAKER_MAX_RESPONSE_BYTES
from adapters.sagemaker.jsonlines import (DEFAULT_CONCURRENCY, JSONLINES, JSONLINES_TYPES, assemble, run_records,
                                          split_records)
from core.api.admission import DECODE_OFF_LOOP_BYTES, decode_json_object, json_object
from core.api.app import create_app
from core.api.asgi_call import Answer, call, inner_scope
from core.api.embeddings.encode import least_embeddings_answer_bytes
from core.api.features import feature_for, router as features_router
from core.api.hot_routes import DECODED_BODY, HotRoutes
from core.api.http import TIMEOUT_HEADER, deadline_for, serving_of, wait_for_disconnect
from core.api.response_limit import ResponseLimit, response_limit_of
from core.serving import Served
from core.api.warm_pass import WarmRequest, registry_requests
from core.capabilities import AUXILIARY_CAPABILITIES
from core.config import Settings
from core.engine import Registry
from core.errors import InvalidInput, NotFound, TesseraError, TooLarge
from core.metrics import Metrics
from core.tracing import NO_TRACER, NoTracer, OtelTracer

CUSTOM_ATTRIBUTES = "x-amzn-sagemaker-custom-attributes"
JSON = "application/json"
NPY = "application/x-npy"
#: routes whose JSON answer can be re-encoded as one (n, d) float32 array
NPY_ROUTES = frozenset({"embeddings"})
_JSON_TYPES = frozenset({JSON, "text/json"}) | JSONLINES_TYPES
_ANY = frozenset({"*/*", "application/*"})


class NotAcceptable(TesseraError):
    status, type, code = 406, "invalid_request_error", "not_acceptable"


class UnsupportedMediaType(TesseraError):
    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


def parse_custom_attributes(value: str | None) -> dict[str, str]:
    """``"route=rerank,model=bge"`` (or ``;``-separated) → ``{"route": "rerank", "model": "bge"}``."""
    pairs: dict[str, str] = {}
    for part in (value or "").replace(";", ",").split(","):
        key, sep, val = part.partition("=")
        if sep and key.strip():
            pairs[key.strip().lower()] = val.strip()
    return pairs


def _media_types(header: str | None) -> list[str]:
    return [p.split(";", 1)[0].strip().lower() for p in (header or "").split(",") if p.strip()]


def wanted_format(accept: str | None, route: str) -> str:
    """``json`` or ``npy``, in the client's order of preference."""
    types = _media_types(accept)
    if not types:
        return "json"
    for media in types:
        if media in _JSON_TYPES or media in _ANY:
            return "json"
        if media == NPY:
            if route not in NPY_ROUTES:
                raise NotAcceptable(f"{NPY} is offered for {sorted(NPY_ROUTES)} only, not {route!r}")
            return "npy"
    raise NotAcceptable(f"cannot answer in {accept!r}; accepted: {JSON}, {NPY} (embeddings)")


def check_content_type(content_type: str | None) -> None:
    types = _media_types(content_type)
    if types and types[0] not in _JSON_TYPES:
        raise UnsupportedMediaType(f"Content-Type {content_type!r} is not supported; send {JSON}")


def post_routes(app: FastAPI) -> dict[str, str]:
    """``{"embeddings": "/v1/embeddings", "rerank": "/v1/rerank", ...}``: every documented ``POST /v1/...``
    route, read from the app's OpenAPI schema (public, and stable across FastAPI's router internals)."""
    found: dict[str, str] = {}
    for path, operations in app.openapi().get("paths", {}).items():
        if path.startswith("/v1/") and "post" in operations and "{" not in path:
            found[path[len("/v1/"):]] = path
    return found


@contextlib.asynccontextmanager
async def client_watch(request: Request):
    """A future done when the client of ``request`` (whose body is read) goes away, for the requests it carries
    (only one task may read its receive channel: the watcher)."""
    disconnected = asyncio.get_running_loop().create_future()

    async def watch() -> None:
        await wait_for_disconnect(request.receive)
        disconnected.set_result(None)

    watcher = asyncio.create_task(watch())
    try:
        yield disconnected
    finally:
        watcher.cancel()


def inner_routes(app: FastAPI) -> HotRoutes:
    """What a request carried by ``/invocations`` goes through: the app's router behind the plain JSON routes'
    hot path (``core.api.hot_routes``), as a client's request meets them past the app's middleware; so a
    body ``/invocations`` decoded already is not decoded again. Built once per app."""
    inner = getattr(app.state, "invocation_routes", None)
    if inner is None:
        inner = app.state.invocation_routes = HotRoutes(app.router, fastapi=app, router=features_router)
    return inner


async def run_route(request: Request, method: str, path: str, body: bytes = b"", *,
                    disconnected: asyncio.Future | None = None, json_body: bool = False,
                    typed_result: bool = False, decoded: dict[str, Any] | None = None,
                    deadline: float | None = None) -> Answer:
    """The request's body through the app's router at ``path`` (``core.api.asgi_call``), in the scope of
    ``request`` (past the app's middleware already). ``json_body``: sent as ``application/json`` (a JSON
    Lines record is one JSON document). ``typed_result``: the route's result comes back unencoded.
    ``decoded``: ``body``'s value, decoded already (the route does not decode it again). ``deadline``
    (``time.monotonic()``): the carried request ends by then, whenever it starts (a mini-batch's records share
    the mini-batch's deadline, so the last window does not outlive the invocation's timeout)."""
    scope = inner_scope(request.scope, method, path)
    if deadline is not None:
        left = f"{max(deadline - time.monotonic(), 0.001):.3f}".encode()
        scope["headers"] = [*(h for h in scope.get("headers", ()) if h[0] != _TIMEOUT_NAME), (_TIMEOUT_NAME, left)]
    if decoded is not None:
        scope["extensions"][DECODED_BODY] = decoded
    return await call(inner_routes(request.app), scope, body, content_type=JSON.encode() if json_body else None,
                      disconnected=disconnected, typed_result=typed_result)


_TIMEOUT_NAME = TIMEOUT_HEADER.encode("latin-1")


def embeddings_npy(served: Served) -> tuple[bytes, dict[str, str]]:
    """An embeddings result → ``.npy`` bytes of its float32 ``(n, d)`` array (the values the JSON answer's
    base64 carries), with model and usage as headers."""
    vectors = served.result.vectors
    if isinstance(vectors, np.ndarray) and vectors.ndim == 2:
        array = np.ascontiguousarray(vectors, dtype="<f4")
    else:
        rows = [np.asarray(v, dtype="<f4") for v in vectors]
        if any(row.ndim != 1 for row in rows):
            raise NotAcceptable(f"{NPY} holds one vector per input; this model answers several per input "
                                f"(multi-vector): ask for {JSON}")
        array = np.stack(rows) if rows else np.zeros((0, 0), dtype="<f4")
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue(), {"x-tessera-model": served.engine.name,
                               "x-tessera-prompt-tokens": str(served.result.prompt_tokens)}


def _from_inner(answer: Answer) -> Response:
    kept = {k.decode(): v.decode() for k, v in answer.headers if k.lower() not in (b"content-length",)}
    return Response(answer.body, status_code=answer.status, headers=kept)


def too_large(size: int, limit: int, route: str, least: bool = False) -> TooLarge:
    """The 413 of SageMaker's response limit (``core.api.response_limit``; ``route``: "npy", "jsonlines" too)."""
    hint = "send fewer inputs per request"
    if route in NPY_ROUTES:
        hint += ", ask for Accept: application/x-npy or encoding_format \"base64\" (about 4x smaller)"
    return TooLarge(f"the response would be {'at least ' if least else ''}{size} bytes, over SageMaker's {limit}-byte "
                    f"limit; {hint}, or embed large corpora with a Batch Transform job (docs/deploy.md)",
                    code="response_too_large")


def _record(record: bytes, attributes: dict[str, str], routes: dict[str, str], request: Request,
            default_route: str | None) -> tuple[str | None, Any]:
    """One JSON Lines record → (route, (payload, body to send)), or (None, (status, error line)) when it is
    refused. The body sent is the record itself unless the attributes' model is added to it."""
    try:
        payload = json_object(record)
        route = str(attributes.get("route") or payload.get("route") or default_route
                    or _only_capability(request)).strip("/").removeprefix("v1/")
        if route not in routes:
            raise NotFound(f"no route {route!r} for /invocations; routes: {sorted(routes)}", param="route")
    except TesseraError as exc:
        return None, _record_error(exc)
    if "model" in attributes and not payload.get("model"):
        payload["model"] = attributes["model"]
        record = orjson.dumps(payload)
    return route, (payload, record)


def _least_answer_bytes(route: str, payload: dict[str, Any], registry: Registry | None) -> int:
    """The fewest bytes an embeddings record's answer can take, from the record alone; 0 where it cannot be
    told (another route, a record the route will refuse)."""
    if route != "embeddings" or registry is None:
        return 0
    return least_embeddings_answer_bytes(payload, registry) or 0


def _record_error(exc: TesseraError) -> tuple[int, bytes]:
    return exc.status, orjson.dumps(exc.body())


def build_router(default_route: str | None = None, *, record_concurrency: int = DEFAULT_CONCURRENCY) -> APIRouter:
    router = APIRouter()

    async def json_lines(request: Request, attributes: dict[str, str], body: bytes) -> Response:
        wanted_format(request.headers.get("accept"), "jsonlines")  # JSON (Lines) or */*; x-npy: 406
        records = split_records(body)
        if not records:
            raise InvalidInput("the JSON Lines body holds no record", code="invalid_json")
        settings = request.app.state.settings
        window = settings.max_items_per_request  # records run at once: each is at least one input
        if len(records) > window and not getattr(settings, "sagemaker_batch", False):
            raise TooLarge(f"{len(records)} records in one request; each is at least one input and the limit is "
                           f"{window} per request on a real-time endpoint: send fewer records per request, or run "
                           "them as a Batch Transform job (SAGEMAKER_BATCH=true answers a mini-batch of any size)",
                           code="too_many_records")
        deadline = deadline_for(request, serving_of(request))  # the mini-batch's: every record ends by it
        routes = post_routes(request.app)

        def parse() -> list[tuple[str | None, Any]]:
            return [_record(record, attributes, routes, request, default_route) for record in records]

        # decoded once (each record's value goes to its route as it is), on a worker thread for a large body
        parsed = await asyncio.to_thread(parse) if len(body) > DECODE_OFF_LOOP_BYTES else parse()
        limit = response_limit_of(request)
        if limit is not None:  # an answer that cannot fit is refused before any record runs
            least = sum(_least_answer_bytes(route, sent[0], request.app.state.registry)
                        for route, sent in parsed if route is not None)
            refusal = limit.refusal_for(least, least=True, asked="jsonlines")
            if refusal is not None:
                raise refusal
        admission = getattr(request.app.state, "inflight_limit", None)

        async def run(index: bytes) -> tuple[int, bytes]:  # the record's index: its line is parsed already
            route, sent = parsed[int(index)]
            if route is None:
                return sent
            refusal = admission.refusal() if admission is not None else None
            if refusal is not None:  # each record is a request in flight: past the cap it waits (429 is retried)
                return _record_error(refusal)
            with admission.held() if admission is not None else contextlib.nullcontext():
                answer = await run_route(request, "POST", routes[route], sent[1], disconnected=disconnected,
                                         json_body=True, decoded=sent[0], deadline=deadline)
            return answer.status, answer.body

        lines: list[bytes] = []
        failed = 0
        async with client_watch(request) as disconnected:
            # windows of at most max_items_per_request records, in order: a mini-batch of tens of thousands
            # holds no more of them in flight than one request may carry
            for start in range(0, len(parsed), window):
                # no more records at once than the in-flight cap leaves room for (each is a request in flight)
                room = admission.max_inflight - admission.inflight if admission is not None else record_concurrency
                done, window_failed = await run_records(
                    [str(i).encode() for i in range(start, min(start + window, len(parsed)))], run,
                    concurrency=max(1, min(record_concurrency, room)))
                lines += done
                failed += window_failed
        answer = assemble(lines)
        refusal = limit.refusal_for(len(answer), asked="jsonlines") if limit is not None else None
        if refusal is not None:
            raise refusal
        return Response(answer, media_type=JSONLINES,
                         headers={"x-tessera-records": str(len(lines)), "x-tessera-failed-records": str(failed)})

    @router.get("/execution-parameters", summary="Batch Transform: the container's preferred job parameters")
    async def execution_parameters(request: Request) -> Response:
        limit_mb = max(1, min(100, request.app.state.settings.max_request_bytes // (1024 * 1024)))
        return Response(orjson.dumps({"MaxConcurrentTransforms": 2, "BatchStrategy": "MULTI_RECORD",
                                      "MaxPayloadInMB": min(6, limit_mb)}), media_type=JSON)

    @router.get("/ping", summary="SageMaker health check: 200 when ready")
    async def ping(request: Request) -> Response:
        return _from_inner(await run_route(request, "GET", "/ready"))

    @router.post("/invocations", summary="SageMaker inference: any POST /v1 route, chosen by attributes or body")
    async def invocations(request: Request) -> Response:
        check_content_type(request.headers.get("content-type"))
        attributes = parse_custom_attributes(request.headers.get(CUSTOM_ATTRIBUTES))
        body = await request.body()
        if (_media_types(request.headers.get("content-type")) or [""])[0] in JSONLINES_TYPES:
            return await json_lines(request, attributes, body)
        payload: dict[str, Any] | None = None
        route = attributes.get("route")
        if not route:
            payload = await decode_json_object(body)
            route = payload.get("route") or default_route or _only_capability(request)
        route = str(route).strip("/").removeprefix("v1/")
        routes = post_routes(request.app)
        if route not in routes:
            raise NotFound(f"no route {route!r} for /invocations; routes: {sorted(routes)}", param="route")
        fmt = wanted_format(request.headers.get("accept"), route)
        if "model" in attributes:  # the body's own model wins; else the attributes' is added to it
            payload = payload if payload is not None else await decode_json_object(body)
            if not payload.get("model"):
                payload["model"] = attributes["model"]
                body = orjson.dumps(payload)
        async with client_watch(request) as disconnected:
            answer = await run_route(request, "POST", routes[route], body, disconnected=disconnected,
                                     typed_result=fmt == "npy", decoded=payload)
        limit = response_limit_of(request)
        if fmt == "npy" and answer.result is not None:
            array, extra = embeddings_npy(answer.result)
            refusal = limit.refusal_for(len(array), asked="npy") if limit is not None else None
            if refusal is not None:
                raise refusal
            return Response(array, media_type=NPY, headers=extra)
        if limit is not None and answer.status == 200:
            refusal = limit.refusal_for(len(answer.body), asked=route)
            if refusal is not None:
                raise refusal
        return _from_inner(answer)

    return router


def _only_capability(request: Request) -> str:
    """The route of the one main capability the served models share (``embeddings/sparse`` for a sparse model)."""
    registry = request.app.state.registry
    capabilities = set()
    for engine in (registry.engines.values() if registry is not None else ()):
        capabilities |= set(engine.task.capabilities) - AUXILIARY_CAPABILITIES
    if len(capabilities) != 1:
        raise InvalidInput(
            "name the route: 'route=embeddings' (or rerank, classify, ...) in X-Amzn-SageMaker-Custom-Attributes "
            f"or a \"route\" field in the body (served capabilities: {sorted(capabilities)})",
            param="route", code="route_required",
        )
    return feature_for(next(iter(capabilities))).route.removeprefix("/v1/")


def warm_requests(registry: Registry) -> list[WarmRequest]:
    """The app's warm pass (``core.api.warm_pass``) plus ``/invocations`` once per route family it covers, named
    in the custom attributes as a client would (its first call also builds the route table, from OpenAPI)."""
    direct = registry_requests(registry)
    via: dict[str, WarmRequest] = {}
    for request in direct:
        route = request.path.removeprefix("/v1/")
        if request.method == "POST" and route not in via:
            via[route] = WarmRequest("POST", "/invocations", request.body,
                                     headers=((CUSTOM_ATTRIBUTES.encode(), f"route={route}".encode()),),
                                     label=f"{request.label} via /invocations")
    return [*direct, *via.values()]


def create_sagemaker_app(settings: Settings, registry: Registry | None = None, *, default_route: str | None = None,
                         max_response_bytes: int = SAGEMAKER_MAX_RESPONSE_BYTES,
                         record_concurrency: int = DEFAULT_CONCURRENCY,
                         tracer: NoTracer | OtelTracer = NO_TRACER, metrics: Metrics | None = None,
                         warm: Callable[[Registry], list[WarmRequest]] = warm_requests) -> FastAPI:
    """The one app (``core.api.app.create_app``) plus ``/ping`` (SageMaker's health check: no API key,
    answered while draining), ``/invocations`` and ``/execution-parameters``.
    ``max_response_bytes``: 0 = no response-size guard. ``warm``: the warm pass (:func:`warm_requests`; a front
    end started again bounds each request's deadline, ``core.api.frontend.warm_requests_for``)."""
    # a model that fails to load keeps /ping at 503 (naming it): SageMaker's health check holds the
    # endpoint back and the reason is in the logs, rather than a container that exits and restarts
    app = create_app(settings, registry, health_paths={"/ping"}, fail_unusable=False,
                     tracer=tracer, warm_requests=warm, metrics=metrics,
                     response_limit=ResponseLimit(max_response_bytes, too_large) if max_response_bytes else None)
    app.include_router(build_router(default_route, record_concurrency=record_concurrency))
    return app


def frontend_app(settings, handoff) -> FastAPI:
    """One front end of ``serve`` with several (``core.api.frontend``): the same app, its models in the
    executors (``handoff.executors``), so ``/ping`` answers 200 only while every executor serves."""
    from core.api.frontend import warm_requests_for
    from core.executor import remote_registry
    from core.tracing import tracer_from_env

    metrics = Metrics()
    tracer = tracer_from_env(os.environ)
    registry = remote_registry(settings, handoff.executors, metrics=metrics, tracer=tracer)
    app = create_sagemaker_app(settings, registry, default_route=settings.sagemaker_route,
                               max_response_bytes=settings.sagemaker_max_response_bytes, tracer=tracer,
                               metrics=metrics, warm=warm_requests_for(handoff, warm_requests))
    return app
