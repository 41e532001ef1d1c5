"""The cyclic garbage collector while a process serves (:func:`tune_for_serving`): called by the app's
lifespan (``core.api.app``) and by an executor process (``core.executor.server``) once their models are
loaded, undone when they stop; and at the end of a Lambda environment's init (``adapters/lambda/handler.py``),
for the environment's life."""

from __future__ import annotations

import gc
from typing import Callable

#: objects allocated (net of those freed) between two collections of the youngest generation while serving
#: (Python's default: 700)
YOUNG_OBJECTS = 10_000


def tune_for_serving() -> Callable[[], None]:
    """Tune the cyclic garbage collector for serving, once the models are loaded; returns what undoes it (when
    the server stops, so that a process that builds servers one after another, as tests do, collects each one).

    What the start-up built (modules, models, the app) lives as long as the server: it is set aside
    (``gc.freeze``; a collection there finds no garbage to free first), where each full collection walked it all
    again, holding the event loop: ~40 ms with one small ONNX model (76,000 objects), ~200 ms with torch
    (420,000). The in-flight requests' objects kept the youngest generation past Python's 700 a few times a
    second, each such collection walking them (~165 µs): with :data:`YOUNG_OBJECTS` they do not. Near-free
    model, one-text requests: ~10% of the server's CPU went to the collector, ~0 after."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(YOUNG_OBJECTS, before[0]), *before[1:])

    def restore() -> None:
        gc.unfreeze()
        gc.set_threshold(*before)

    return restore
