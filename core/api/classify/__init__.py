"""Classification: ``/v1/classify`` (Infinity's shape: ``routes.py``) and TEI's ``/predict`` (``tei.py``), their
schemas and answers. The work itself: ``core.serving.ranking.classify`` and ``predict``."""

from __future__ import annotations

from fastapi import APIRouter

from core.api.common import Feature, WARM_TEXT
from core.api.classify import routes, tei
from core.capabilities import Capability


def _warm(name: str, modalities: tuple[str, ...]) -> list[tuple[str, dict]]:
    return [("classify", {"model": name, "input": WARM_TEXT})]


router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)

FEATURE = Feature(router, capability=Capability.CLASSIFY, route="/v1/classify", warm=_warm)
