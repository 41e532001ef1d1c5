"""The backend contract: accelerator/runtime code only. No tokenizers, no HTTP, no pooling.

A backend runs one *head* of a model folder (see ``heads.py``) on named numpy inputs and returns the
head's named numpy outputs, e.g. ``encoder``: ``input_ids``, ``attention_mask`` (and ``token_type_ids``
where the model takes them) → ``last_hidden_state`` (batch, seq, hidden).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping

import numpy as np

from core.errors import Unsupported

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

    def to_device(self, device: str, dtype: str | None = None) -> None:
        """Move the loaded weights to ``device`` (and cast them to ``dtype`` when given), in place, under
        the same device/dtype rules as ``load``: weights loaded on the CPU before a memory snapshot go to
        the GPU after restore. Default: refused, for runtimes that bind weights to a device when they
        load (ONNX Runtime sessions, CTranslate2, compiled Neuron graphs): load those on their device."""
        raise Unsupported(f"the {self.name} backend cannot move a loaded model to {device!r}; "
                          "load it on that device instead")

    def describe(self) -> dict:
        """What ``/v1/models`` shows of it (runtime, device, dtype, providers)."""
        return {"backend": self.name}
