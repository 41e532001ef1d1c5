"""``/v1/score``: late-interaction (MaxSim) scores of documents against a query, its schemas and answer. The
work itself: ``core.serving.ranking.maxsim``."""

from fastapi import APIRouter

from core.api.common import Feature
from core.api.score import routes
from core.capabilities import Capability

router = APIRouter()
for _module in (routes,):
    router.include_router(_module.router)

FEATURE = Feature(router, capability=Capability.SCORE, route="/v1/score")
