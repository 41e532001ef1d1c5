"""``uvicorn tests.support.faulty_app:app``: the real app over the configured models, whose tasks raise a
plain ``RuntimeError`` (a bug, not a TesseraError) while preparing any request whose texts contain
FAULT_WORD. For tests of what a server process does after an unexpected exception."""

from __future__ import annotations

from core.api.app import create_app
from core.config import Settings
from core.engine import Registry

FAULT_WORD = "volcano"


class _Faulty:
    def __init__(self, inner):
        self.inner = inner

    def prepare(self, request):
        if any(FAULT_WORD in text for text in (request.texts or [])):
            raise RuntimeError("injected fault")
        return self.inner.prepare(request)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _build():
    settings = Settings()
    registry = Registry.from_settings(settings)
    for engine in registry.engines.values():
        engine.task = _Faulty(engine.task)
    return create_app(settings, registry)


app = _build()
