"""``/docs`` (Swagger UI) and ``/redoc`` served offline: their JavaScript, CSS and icon come from the app
itself (the files the ``fastapi-offline`` package ships), not from a CDN, so the pages work on a machine
without internet. Who may open them follows ``docs_public`` (see ``core.api.gate.Gate``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from core.errors import MissingDependency, NotFound

#: the asset files, by the name they are served under (``/docs/assets/NAME``)
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "redoc.standalone.js": "text/javascript", "favicon.png": "image/png"}
ASSET_PREFIX = "/docs/assets/"
#: every path of the documentation (the gate opens them all, or none)
DOC_PATHS = frozenset({"/docs", "/redoc", "/openapi.json", *(ASSET_PREFIX + name for name in ASSETS)})


def assets_folder() -> Path:
    """The folder of the Swagger UI / ReDoc files, located without importing the package."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependency("the offline /docs needs the package fastapi-offline: pip install fastapi-offline "
                                "(a dependency of tessera-serve)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def add_offline_docs(app: FastAPI, title: str) -> None:
    """``/docs``, ``/redoc`` and ``/docs/assets/*`` on ``app`` (created with ``docs_url=None, redoc_url=None``).
    Links carry the request's root path (``root_path`` / ``url_prefix``), as FastAPI's own pages do."""

    def root(request: Request) -> str:
        return request.scope.get("root_path", "").rstrip("/")

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> Response:
        base = root(request)
        return get_swagger_ui_html(openapi_url=base + app.openapi_url, title=f"{title} - Swagger UI",
                                   swagger_js_url=f"{base}{ASSET_PREFIX}swagger-ui-bundle.js",
                                   swagger_css_url=f"{base}{ASSET_PREFIX}swagger-ui.css",
                                   swagger_favicon_url=f"{base}{ASSET_PREFIX}favicon.png")

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        base = root(request)
        return get_redoc_html(openapi_url=base + app.openapi_url, title=f"{title} - ReDoc",
                              redoc_js_url=f"{base}{ASSET_PREFIX}redoc.standalone.js",
                              redoc_favicon_url=f"{base}{ASSET_PREFIX}favicon.png", with_google_fonts=False)

    @app.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            raise NotFound(f"no documentation asset {name!r}")
        return FileResponse(assets_folder() / name, media_type=ASSETS[name],
                            headers={"Cache-Control": "public, max-age=86400"})
