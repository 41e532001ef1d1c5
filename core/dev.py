"""Local server: ``uvicorn core.dev:app``. Settings come from ``TESSERA_*`` variables (this module is
the edge: importing it builds the app, which is what uvicorn asks of it). The server has chosen its HTTP
protocol before it imports this module, so the request-head limit (``max_header_bytes``) is put on
uvicorn's httptools protocol here (``core.api.http_limits.bound_httptools``); h11 bounds heads itself."""

import os
import sys

from core.api.app import create_app
from core.api.http_limits import bound_httptools
from core.config import settings_from_env
from core.errors import ConfigError
from core.logs import configure_logging
from core.tracing import tracer_from_env

try:
    settings = settings_from_env(os.environ)
except ConfigError as exc:
    print(f"tessera: {exc.message}", file=sys.stderr)
    raise SystemExit(2) from None
configure_logging(settings.log_level, fmt=settings.log_format)
try:
    tracer = tracer_from_env(os.environ)
except ConfigError as exc:
    print(f"tessera: {exc.message}", file=sys.stderr)
    raise SystemExit(2) from None
bound_httptools(settings.max_header_bytes)
app = create_app(settings, tracer=tracer)
