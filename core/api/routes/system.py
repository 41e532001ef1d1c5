"""Service routes: ``/v1/models``, ``/health``, ``/ready``, ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api import protocol
from core.api.encode import dumps
from core.api.routes.common import JSONBytes, registry_of
from core.errors import NotReady

router = APIRouter()


@router.get("/v1/models", response_model=protocol.ModelList, summary="List served models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> Response:
    return JSONBytes(dumps({"object": "list", "data": registry_of(request).cards()}))


@router.get("/health", summary="Liveness: the process answers")
async def health() -> Response:
    return JSONBytes(b'{"status":"ok"}')


@router.get("/ready", summary="Readiness: every model loaded and healthy", responses={503: {"model": protocol.ErrorResponse}})
async def ready(request: Request) -> Response:
    registry = registry_of(request)
    models = {name: ("ready" if e.healthy else f"unhealthy: {e.last_error}") for name, e in registry.engines.items()}
    models.update({name: f"failed to load: {f.error}" for name, f in registry.failed.items()})
    if request.app.state.draining:
        raise NotReady("server is shutting down")
    if not registry.ready:
        bad = {k: v for k, v in models.items() if v != "ready"}
        raise NotReady(f"not ready: {bad or 'no models loaded'}")
    return JSONBytes(dumps({"status": "ready", "models": models}))


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    m = request.app.state.metrics
    registry = request.app.state.registry
    if registry is not None:
        for name, engine in registry.engines.items():
            m.queue_depth.labels(name).set(engine.batcher.depth)
    return Response(m.render(), media_type=m.content_type)
