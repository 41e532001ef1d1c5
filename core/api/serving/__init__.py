"""The serving layer: request → engine → result, per task, with no HTTP in it.

Routes (``core/api/routes``) parse a wire request, call one function here and encode what it returns
(``core/api/encode.py``); adapters call the same functions in-process (Modal's bulk path). Every input
limit is checked here (``inputs.py``), once, whatever the wire shape."""

from core.api.serving.context import Served, Serving

__all__ = ["Served", "Serving"]
