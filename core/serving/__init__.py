"""The serving layer: request → engine → result, per task, with no HTTP in it (the library tier: nothing
here imports FastAPI, Starlette or ``core.api``).

The HTTP features (``core/api/<feature>/``) parse a wire request, call one function here and encode what it
returns; the in-process API (``core/inprocess.py``) and the adapters call the same functions without HTTP.
Every input limit is checked here (``inputs.py``), once, whatever the wire shape."""

from core.serving.context import Served, ServingContext

__all__ = ["Served", "ServingContext"]
