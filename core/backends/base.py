"""The backend contract: accelerator/runtime code only. No tokenizers, no HTTP, no pooling.

A backend runs one *head* of a model folder (see ``heads.py``) on named numpy inputs and returns the
head's named numpy outputs, e.g. ``encoder``: ``input_ids``, ``attention_mask`` (and ``token_type_ids``
where the model takes them) → ``last_hidden_state`` (batch, seq, hidden).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping

import numpy as np

if TYPE_CHECKING:
    from core.config import ModelSpec


class Backend:
    """The base every backend derives from (like TEI's ``Backend`` trait): subclasses implement
    ``from_spec``, ``load`` and ``run``; the limits and ``describe`` have these defaults. The engine reads
    a backend's limits from here and nowhere else (``Engine.max_batch_size``)."""

    name: ClassVar[str]
    #: fixed compiled batch size (Neuron), or None for dynamic shapes (the spec's ``max_batch_size`` applies)
    max_batch_size: int | None = None
    #: longest sequence it can run (static shapes), or None (the model's own maximum applies)
    max_sequence_length: int | None = None
    #: how many ``run`` calls it takes at once from different threads
    lanes: int = 1

    @classmethod
    def from_spec(cls, spec: "ModelSpec") -> "Backend":
        """Build an unloaded backend for a model spec (reads only what it needs from the spec)."""
        raise NotImplementedError

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        raise NotImplementedError

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        raise NotImplementedError

    def describe(self) -> dict:
        """What ``/v1/models`` shows of it (runtime, device, dtype, providers)."""
        return {"backend": self.name}
