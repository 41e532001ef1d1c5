"""Local server: ``uvicorn core.dev:app``. Settings come from ``TESSERA_*`` variables (the edge)."""

from core.api.app import create_app
from core.config import Settings
from core.logs import configure_logging

settings = Settings()
configure_logging(settings.log_level)
app = create_app(settings)
