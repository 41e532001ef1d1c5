"""The backend contract: accelerator/runtime code only. No tokenizers, no HTTP, no pooling.

A backend runs one *head* of a model folder (see ``heads.py``) on named numpy inputs and returns the
head's named numpy outputs, e.g. ``encoder``: ``input_ids``, ``attention_mask`` (and ``token_type_ids``
where the model takes them) → ``last_hidden_state`` (batch, seq, hidden).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from core.config import ModelSpec


@runtime_checkable
class Backend(Protocol):
    name: ClassVar[str]
    #: fixed compiled batch size (Neuron) or None for dynamic shapes
    max_batch_size: int | None
    # optional: ``lanes: int``, how many ``run`` calls it takes at once from different threads (default 1)

    @classmethod
    def from_spec(cls, spec: "ModelSpec") -> "Backend":
        """Build an unloaded backend for a model spec (reads only what it needs from the spec)."""
        ...

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None: ...

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...

    def health(self) -> None:
        """Raise ``BackendFailure`` when the backend cannot serve."""
        ...

    def describe(self) -> dict:
        """What ``/v1/models`` shows of it (runtime, device, dtype, providers)."""
        ...
