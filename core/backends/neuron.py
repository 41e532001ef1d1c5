"""AWS Neuron backend (Inferentia 2 / Trainium) through ``optimum-neuron``.

A Neuron model runs only the static shapes it was compiled for, so ``scripts/compile_neuron.py`` compiles
one model per bucket (batch size × sequence length) into ``<folder>/neuron/`` with a ``manifest.json``.
All routing — smallest fitting bucket, padding, un-padding, splitting oversize batches, refusing
over-long inputs — is :class:`core.backends.buckets.BucketedBackend`, shared and tested on CPU; this
module only loads one compiled bucket and calls it.

NOT run on Inferentia by this project so far: see docs/backends.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Collection, Mapping

import numpy as np

from core.backends.base import BackendOptions, Folder, device_kind
from core.backends.buckets import MANIFEST_NAME, Bucket, BucketedBackend
from core.errors import InvalidInput, require

if TYPE_CHECKING:
    from core.config import ModelSpec

#: optimum-neuron class for the encoder head (unchanged in optimum-neuron 0.4.x; the
#: sentence-transformers class was renamed NeuronSentenceTransformers in 0.4.2, we do not use it:
#: pooling is ours, so only the token vectors are needed)
NEURON_CLASSES = {"encoder": "NeuronModelForFeatureExtraction"}


def neuron_model_class(head: str = "encoder"):
    if head not in NEURON_CLASSES:
        raise InvalidInput(f"neuron backend: no compiled model class for head {head!r}; known: {sorted(NEURON_CLASSES)}")
    optimum_neuron = require("optimum.neuron", "neuron")
    return getattr(optimum_neuron, NEURON_CLASSES[head])


class NeuronBackend(BucketedBackend):
    name: ClassVar[str] = "neuron"
    extra: ClassVar[str] = "neuron"
    runtime: ClassVar[str | None] = "optimum"
    subdir: ClassVar[str] = "neuron"
    #: compiled for one kind of chip: asked first
    auto_order: ClassVar[int | None] = 0
    artifact_label: ClassVar[str] = "compiled Neuron buckets"

    @classmethod
    def files(cls, listing: Collection[str], *, dtype: str, options: BackendOptions | None) -> list[str]:
        """The compiled buckets' folder, ``neuron/`` (its ``manifest.json`` first)."""
        main = f"{cls.subdir}/{MANIFEST_NAME}"
        if main not in listing:
            return []
        return [main, *sorted(f for f in listing if f.startswith(cls.subdir + "/") and f != main)]

    @classmethod
    def missing_files(cls, where: str, *, dtype: str, options: BackendOptions | None) -> str:
        return f"{where} has no {cls.subdir}/ folder for the neuron backend"

    @classmethod
    def can_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        """Compiled buckets serve on any device but CUDA; a Neuron device runs compiled buckets only (neither
        ONNX Runtime nor torch serve it), so a folder without them is refused there."""
        kind = device_kind(spec.device)
        if f"{cls.subdir}/{MANIFEST_NAME}" in folder.files and kind != "cuda":
            return "the folder holds compiled Neuron buckets (neuron/manifest.json)"
        if kind == "neuron":
            raise InvalidInput(f"model {spec.served_name!r}: device 'neuron' serves compiled Neuron buckets, and "
                               f"{spec.path} has none (no neuron/manifest.json); compile them with "
                               f"`python scripts/compile_neuron.py {spec.path} OUT` and serve OUT")
        return None

    @classmethod
    def cannot_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        if f"{cls.subdir}/{MANIFEST_NAME}" in folder.files:
            return f"compiled Neuron buckets do not run on {spec.device}"
        return None

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        if device.startswith("cuda"):
            raise InvalidInput(f"neuron backend: device {device!r} is not a Neuron device; use device 'neuron'")
        self._model_class = neuron_model_class(head)  # fail before reading buckets when the extra is absent
        super().load(model_dir, head=head, device="neuron", dtype=dtype, threads=threads)

    def load_bucket(self, path: Path, bucket: Bucket, *, device: str, threads: int):
        import torch

        model = self._model_class.from_pretrained(str(path))

        def call(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.inference_mode():
                out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()})
            return {"last_hidden_state": out.last_hidden_state.float().numpy()}

        return call
