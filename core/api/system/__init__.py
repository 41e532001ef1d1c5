"""The service's own routes: ``/v1/models``, ``/health``, ``/ready``, ``/metrics`` (``routes.py``); TEI's
server routes ``/info`` and ``/`` (the served model's own task, ``tei.py``)."""

from fastapi import APIRouter

from core.api.common import Feature
from core.api.system import routes, tei

router = APIRouter()
for _module in (routes, tei):
    router.include_router(_module.router)

FEATURE = Feature(router)
