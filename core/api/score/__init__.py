"""``/v1/score``: late-interaction (MaxSim) scores of documents against a query, its schemas and answer. The
work itself: ``core.serving.ranking.score``."""

from fastapi import APIRouter

from core.api.score import routes

router = APIRouter()
for _module in (routes,):
    router.include_router(_module.router)
