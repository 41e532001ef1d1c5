"""Executor processes: one per device, holding the models' weights and batchers, fed by front-end processes
through shared memory (see docs/architecture.md, "Executors").

- ``ExecutorSet`` (``supervisor.py``): the supervisor's handle on them: start, address, pids, check,
  restart, stop.
- ``remote_registry`` (``client.py``): in a front end, a ``Registry`` whose engines tokenize here and run
  their items in the executors.
- ``server.py``: the executor process; ``wire.py``: what crosses; ``shm.py``: the arenas."""

from core.executor.client import remote_registry
from core.executor.supervisor import ExecutorSet

__all__ = ["ExecutorSet", "remote_registry"]
