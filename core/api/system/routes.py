"""Service routes: ``/v1/models``, ``/health``, ``/ready``, ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.api.common import ErrorResponse, dumps
from core.api.system import schemas
from core.api.system.encode import model_list
from core.api.http import JSONBytes, serving_of
from core.frontends import ONE_PROCESS
from core.serving import models

router = APIRouter()


@router.get("/v1/models", response_model=schemas.ModelList, summary="List served models")
@router.get("/models", include_in_schema=False)
async def list_models(request: Request) -> Response:
    # how many front-end processes serve, and why (set by the entry point; one process where none says)
    frontends = getattr(request.app.state, "frontends", None) or ONE_PROCESS
    return JSONBytes(dumps(model_list(models.cards(serving_of(request)), frontends.as_dict())))


@router.get("/health", summary="Liveness: the process answers")
async def health() -> Response:
    return JSONBytes(b'{"status":"ok"}')


@router.get("/ready", summary="Readiness: every model loaded and healthy", responses={503: {"model": ErrorResponse}})
async def ready(request: Request) -> Response:
    registry = serving_of(request).registry
    return JSONBytes(dumps(models.readiness(registry, draining=request.app.state.draining)))


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    m = request.app.state.metrics
    peers = getattr(request.app.state, "metrics_peers", None)
    if peers is not None:  # several processes: this answer gathers them all (the queue depths are the executors')
        return Response(await peers.gather(m.render()), media_type=m.content_type)
    registry = request.app.state.registry
    if registry is not None:
        for name, engine in registry.engines.items():
            m.queue_depth.labels(name).set(engine.batcher.depth)
    return Response(m.render(), media_type=m.content_type)
