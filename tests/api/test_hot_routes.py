"""core/api/hot_routes.py: the plain JSON routes are answered without FastAPI's routing and dependency layers,
and every answer is the one FastAPI gives (the same app with the hot path turned off by a dependency override,
which sends every request through FastAPI)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import Response
from fastapi.testclient import TestClient
from pydantic import BaseModel

from core.api.app import create_app
from core.api.features import router as features_router
from core.api.hot_routes import hot_routes
from core.config import Settings


class Seen:
    """Outermost middleware of the test app: the scope each request ended with (the layers inside share it)."""

    def __init__(self, app, *, scopes: list):
        self.app, self.scopes = app, scopes

    async def __call__(self, scope, receive, send):
        await self.app(scope, receive, send)
        if scope["type"] == "http":
            self.scopes.append(scope)


@pytest.fixture(scope="module")
def served(minilm_onnx_dir):
    app = create_app(Settings(threads=2, models=[{"path": str(minilm_onnx_dir), "name": "minilm"}]))
    scopes: list = []
    app.add_middleware(Seen, scopes=scopes)
    with TestClient(app) as client:
        yield app, client, scopes


@contextmanager
def through_fastapi(app):
    """Every request through FastAPI's own routing (any dependency override turns the hot path off)."""
    app.dependency_overrides[through_fastapi] = lambda: None
    try:
        yield
    finally:
        app.dependency_overrides.pop(through_fastapi)


def test_every_plain_json_route_is_hot_and_nothing_else():
    hot = hot_routes(features_router.routes)
    assert {"/v1/embeddings", "/embeddings", "/embed", "/v1/rerank", "/rerank", "/v1/classify", "/classify",
            "/v2/embed", "/v1/embeddings/sparse", "/tokenize"} <= set(hot)
    assert "/" not in hot  # TEI's route picks its schema from the body
    assert not any("GET" in (r.route.methods or ()) for r in hot.values())


class Body(BaseModel):
    x: int


def test_a_route_fastapi_would_not_reach_or_that_takes_more_than_a_body_is_not_hot():
    router = APIRouter()

    @router.post("/shadow/{anything}")
    async def catch_all(anything: str, body: Body) -> Response:
        return Response()

    @router.post("/shadow/me")  # the router answers a POST to it with the route above
    async def shadowed(body: Body, request: Request) -> Response:
        return Response()

    @router.post("/with-query")
    async def with_query(body: Body, limit: int = 3) -> Response:
        return Response()

    @router.post("/returns-a-dict")
    async def returns_a_dict(body: Body) -> dict:
        return {}

    @router.post("/plain")
    async def plain(body: Body, request: Request) -> Response:
        return Response()

    assert set(hot_routes(router.routes)) == {"/plain"}


def _answer(response) -> tuple:
    headers = {k: v for k, v in response.headers.items() if k in ("content-type", "retry-after", "content-length")}
    return response.status_code, headers, response.content


#: (path, body bytes, headers): successes, and each way a request can be refused before or inside the route
REQUESTS = [
    ("/v1/embeddings", json.dumps({"model": "minilm", "input": ["a text", "another"]}), {}),
    ("/v1/embeddings", json.dumps({"input": "one", "encoding_format": "base64", "dimensions": 8}), {}),
    ("/embed", json.dumps({"inputs": ["tei's shape"], "normalize": False}), {}),
    ("/embed", json.dumps({"inputs": "x"}), {"content-type": "application/vnd.api+json"}),
    ("/v1/embeddings", json.dumps({"input": "sent as a form"}), {"content-type": "application/x-www-form-urlencoded"}),
    ("/v1/embeddings", json.dumps({"input": "x"}), {"content-type": "text/xml"}),  # not read as JSON: 400
    ("/v1/embeddings", "", {}),  # no body
    ("/v1/embeddings", '{"input": ', {}),  # not JSON
    ("/v1/embeddings", b'{"input": "\xff"}', {}),  # not UTF-8
    ("/v1/embeddings", '{"input": "x", "dimensions": 1' + "0" * 5000 + "}", {}),  # past Python's digit limit
    ("/v1/embeddings", '["a", "list"]', {}),
    ("/v1/embeddings", json.dumps({"input": "x", "dimensions": "8"}), {}),  # strict: no coercion
    ("/v1/embeddings", json.dumps({"input": ["x"], "model": "nope"}), {}),  # raised by the route: 404
    ("/v1/embeddings", json.dumps({"input": []}), {}),  # raised by the serving layer: 400
    ("/v1/embeddings", json.dumps({"input": "x"}), {"x-request-timeout": "soon"}),
    ("/v1/embeddings", '{"input": NaN}', {}),
]


@pytest.mark.parametrize("path,body,headers", REQUESTS, ids=range(len(REQUESTS)))
def test_every_answer_is_the_one_fastapi_gives(served, path, body, headers):
    app, client, _ = served
    headers = {"content-type": "application/json", **headers}
    hot = client.post(path, content=body, headers=headers)
    with through_fastapi(app):
        plain = client.post(path, content=body, headers=headers)
    assert _answer(hot) == _answer(plain)
    assert hot.headers["x-request-id"] and hot.headers["x-request-id"] != plain.headers["x-request-id"]


def test_the_hot_path_skips_fastapis_layers_and_keeps_the_route_for_metrics(served):
    app, client, scopes = served
    body = {"model": "minilm", "input": "counted"}
    scopes.clear()
    assert client.post("/v1/embeddings", json=body).status_code == 200
    with through_fastapi(app):
        assert client.post("/v1/embeddings", json=body).status_code == 200
    # invalid: answered here too, with FastAPI's own validation errors (the body is not parsed again)
    assert client.post("/v1/embeddings", json={"input": 3}).status_code == 422
    hot, plain, invalid = scopes
    assert "fastapi_inner_astack" not in hot and "fastapi_inner_astack" in plain and "fastapi_inner_astack" not in invalid
    assert hot["route"] is plain["route"]
    metrics = client.get("/metrics").text
    line = next(ln for ln in metrics.splitlines()
                if ln.startswith("tessera_requests_total") and 'route="/v1/embeddings"' in ln and '"200"' in ln)
    assert float(line.rsplit(" ", 1)[1]) >= 2


def test_the_apps_own_routes_are_served_too():
    app = FastAPI()

    class Odd(ValueError):
        pass

    @app.post("/plain")
    async def plain(body: Body, request: Request) -> Response:
        if body.x == 418:
            raise HTTPException(418)
        if body.x % 2:
            raise Odd(body.x)
        return Response(str(body.x * 2))

    @app.exception_handler(418)
    async def teapot(request: Request, exc: HTTPException) -> Response:
        return Response("teapot", status_code=418)

    @app.exception_handler(ValueError)
    def odd(request: Request, exc: ValueError) -> Response:  # a plain function: called as is
        return Response(f"odd {exc}", status_code=400)

    from core.api.hot_routes import HotRoutes

    scopes: list = []
    app.add_middleware(HotRoutes, fastapi=app)
    app.add_middleware(Seen, scopes=scopes)
    with TestClient(app) as client:
        assert client.post("/plain", json={"x": 21}).text == "odd 21"  # the nearest class's handler
        assert (client.post("/plain", json={"x": 418}).text, client.post("/plain", json={"x": 2}).text) == (
            "teapot", "4")  # an HTTP exception: its status's handler
        assert client.post("/plain", json={"x": "a"}).status_code == 422
        assert client.post("/elsewhere", json={"x": 1}).status_code == 404
    assert ["fastapi_inner_astack" in scope for scope in scopes] == [False, False, False, False, False]
