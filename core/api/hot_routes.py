"""The API's routes without FastAPI's per-request machinery: :class:`HotRoutes`, the innermost middleware,
answers a request to one of the plain JSON routes itself and hands every other request to FastAPI.

A plain JSON route is a ``POST`` route that takes one pydantic body and the ``Request``, nothing else (no
path, query or header parameter, no dependency), and returns a ``Response``: every feature's route
(``/v1/embeddings``, ``/embed``, ``/rerank``, ``/classify``, …). For those FastAPI's routing (a match over
every route), dependency solving, exit stacks and exception layers do nothing that the route needs; per
request, what is left is what they amount to, built once per route here:

- the body read (the whole of it: ``core.api.admission.BodyReader`` has read it already, and bounded its
  nesting and its number of values) and decoded once, with orjson (on a worker thread for a large body), then
  validated with the route's model, as FastAPI would (the same model, the same strict validation); a body that
  does not validate is answered with the errors FastAPI's own validation of the same value gives (its body
  field's), through the app's handler of ``RequestValidationError``, so the body is never parsed twice;
- the route called with the model and a ``Request``, its exceptions answered by the app's exception handlers
  (the same handlers FastAPI's exception layers call), everything else left to propagate as FastAPI does;
- the scope given the route (``scope["route"]``: what the metrics, the access log and the trace read).

Whatever is not the ordinary case goes to FastAPI, with the body handed on: a body that orjson does not read
(not JSON, or JSON that only Python's reader takes: a lone surrogate escape, NaN, an integer past 64 bits),
not sent as JSON, or empty (FastAPI then answers with its own error, the one it always gave);
another method or path; a route registered after one that matches the same request first; any dependency
override. An in-process caller that decoded the body already (SageMaker's ``/invocations``, a JSON Lines record)
hands the value over in the scope's extensions (:data:`DECODED_BODY`), and it is not decoded again. So every answer but a successful one's route call is FastAPI's own, and the OpenAPI document is
untouched (the routes are FastAPI's, only not routed by it)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from fastapi import params
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from core.api.admission import decode_json, replay_body
from core.api.paths import route_path


@dataclass(frozen=True, slots=True)
class HotRoute:
    """What serving one route takes, found once: the route, its body's model and the names it is called with."""

    route: APIRoute
    model: type[BaseModel]
    body_name: str
    request_name: str | None

    def validation_errors(self, data: Any) -> list[Any]:
        """What FastAPI's validation of ``data`` reports (its body field's own, located under ``body``): the
        errors FastAPI answers a body that does not validate with."""
        return self.route.dependant.body_params[0].validate(data, {}, loc=("body",))[1]

    async def call(self, body: BaseModel, request: Request) -> Any:
        values: dict[str, Any] = {self.body_name: body}
        if self.request_name is not None:
            values[self.request_name] = request
        return await self.route.endpoint(**values)


def hot_route(route: Any) -> HotRoute | None:
    """``route`` as a plain JSON route, or None when FastAPI must serve it (see the module's docstring)."""
    if not isinstance(route, APIRoute) or route.methods != {"POST"} or route.param_convertors or route.path == "/":
        return None
    dependant = route.dependant
    if (dependant.path_params or dependant.query_params or dependant.header_params or dependant.cookie_params
            or dependant.dependencies or dependant.websocket_param_name or dependant.http_connection_param_name
            or dependant.response_param_name or dependant.background_tasks_param_name
            or dependant.security_scopes_param_name or len(dependant.body_params) != 1 or route.dependencies):
        return None
    endpoint = route.endpoint
    if not inspect.iscoroutinefunction(endpoint):
        return None
    field = dependant.body_params[0]
    model = field.field_info.annotation
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return None
    info = field.field_info
    if not isinstance(info, params.Body) or isinstance(info, params.Form) or getattr(info, "embed", False):
        return None  # a form, or a body FastAPI embeds under the parameter's name
    returns = inspect.signature(endpoint).return_annotation
    if isinstance(returns, str):  # postponed: a plain name in the endpoint's module (anything else stays FastAPI's)
        returns = getattr(inspect.unwrap(endpoint), "__globals__", {}).get(returns)
    if not (isinstance(returns, type) and issubclass(returns, Response)):
        return None  # FastAPI serializes anything else through the response model
    return HotRoute(route, model, field.name, dependant.request_param_name)


def hot_routes(routes: list[Any]) -> dict[str, HotRoute]:
    """The plain JSON routes of ``routes`` (a router's, in order) by path, each only if no route before it
    matches a ``POST`` to its path (the router would answer with that one)."""
    found: dict[str, HotRoute] = {}
    for i, route in enumerate(routes):
        hot = hot_route(route)
        if hot is None or hot.route.path in found:
            continue
        if any(earlier.matches(_probe(hot.route.path))[0] == Match.FULL for earlier in routes[:i]):
            continue
        found[hot.route.path] = hot
    return found


#: in a scope's ``extensions``: the body's value, decoded by the in-process caller that sends it
DECODED_BODY = "tessera.decoded_body"
#: a body orjson did not read
_NOT_READ = object()


def _validated(hot: HotRoute, data: Any) -> BaseModel:
    """``data`` as the route's model, or the ``RequestValidationError`` FastAPI raises for it (the app's handler
    answers it, as FastAPI's exception layer would)."""
    if isinstance(data, dict):
        try:
            return hot.model.model_validate(data)
        except ValidationError:
            pass
    raise RequestValidationError(hot.validation_errors(data), body=data)


def _probe(path: str) -> Scope:
    return {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": [], "query_string": b""}


#: the content types FastAPI reads a body as JSON for (``application/json``, ``application/*+json``)
def _json_content_type(headers) -> bool:
    for name, value in headers:
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
    return False


class HotRoutes:
    """Innermost middleware: the plain JSON routes of ``router`` answered without FastAPI's routing, dependency and
    exception layers (module docstring). ``app``: what FastAPI runs inside its user middleware (its exception
    layers and router); ``fastapi``: the app, for its routes, exception handlers and dependency overrides (read at
    the first request, when every route, an adapter's too, is in place); ``router``: the router whose routes are
    served, the app's own or one it includes as it is (no prefix, no dependency): only those of its routes that
    no route the app lists before it would answer."""

    def __init__(self, app: ASGIApp, *, fastapi, router=None) -> None:
        self.app = app
        self.fastapi = fastapi
        self.router = router if router is not None else fastapi.router
        self.routes: dict[str, HotRoute] | None = None
        self.handlers: dict[Any, Callable] = {}
        self.status_handlers: dict[int, Callable] = {}

    def _prepare(self) -> dict[str, HotRoute]:
        top = list(self.fastapi.router.routes)
        if self.router is self.fastapi.router:
            self.routes = hot_routes(top)
        else:  # where the app includes the router (FastAPI keeps an inclusion as one route), and what comes before
            at = next((i for i, r in enumerate(top) if getattr(r, "original_router", None) is self.router), None)
            found = hot_routes(list(self.router.routes)) if at is not None else {}
            self.routes = {path: hot for path, hot in found.items()
                           if not any(r.matches(_probe(path))[0] == Match.FULL for r in top[:at])}
        handlers = self.fastapi.exception_handlers
        self.handlers = {k: v for k, v in handlers.items() if isinstance(k, type)}
        self.status_handlers = {k: v for k, v in handlers.items() if isinstance(k, int)}
        return self.routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        routes = self.routes if self.routes is not None else self._prepare()
        hot = (routes.get(route_path(scope)) if scope["type"] == "http" and scope["method"] == "POST"
               and not self.fastapi.dependency_overrides else None)
        if hot is None or not _json_content_type(scope.get("headers", ())):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # gone before its body arrived: nobody is left to answer
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        extensions = scope.get("extensions")
        data = extensions.get(DECODED_BODY, _NOT_READ) if extensions else _NOT_READ
        if data is _NOT_READ and body:
            try:
                data = await decode_json(body)
            except orjson.JSONDecodeError:
                pass
        if data is _NOT_READ:  # FastAPI answers it, as it always did (its own JSON reading and error)
            await self.app(scope, replay_body(body, receive), send)
            return
        scope["route"], scope["endpoint"], scope["path_params"] = hot.route, hot.route.endpoint, {}
        scope.setdefault("router", self.fastapi.router)
        request = Request(scope, replay_body(body, receive))
        try:
            response = await hot.call(_validated(hot, data), request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = handler(request, exc)
            if inspect.isawaitable(response):
                response = await response
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Callable | None:
        """The app's handler for ``exc``, as Starlette's exception layer picks it: an HTTP exception's status
        first, then the nearest class."""
        if isinstance(exc, HTTPException) and exc.status_code in self.status_handlers:
            return self.status_handlers[exc.status_code]
        for kind in type(exc).__mro__:
            if kind in self.handlers:
                return self.handlers[kind]
        return None
