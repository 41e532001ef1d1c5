"""Local server: ``uvicorn core.dev:app``. Settings come from ``TESSERA_*`` variables (this module is
the edge: importing it builds the app, which is what uvicorn asks of it)."""

import os
import sys

from core.api.app import create_app
from core.config import settings_from_env
from core.errors import ConfigError
from core.logs import configure_logging

try:
    settings = settings_from_env(os.environ)
except ConfigError as exc:
    print(f"tessera: {exc.message}", file=sys.stderr)
    raise SystemExit(2) from None
configure_logging(settings.log_level)
app = create_app(settings)
