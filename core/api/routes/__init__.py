"""Route modules, one per concern. Add a module here to add routes to every surface."""

from fastapi import APIRouter

from core.api.routes import embeddings, system

router = APIRouter()
for module in (embeddings, system):
    router.include_router(module.router)
