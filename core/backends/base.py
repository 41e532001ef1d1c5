"""The backend contract: accelerator/runtime code only. No tokenizers, no HTTP, no pooling.

A backend runs one *head* of a model folder (see ``heads.py``) on named numpy inputs and returns the
head's named numpy outputs, e.g. ``encoder``: ``input_ids``, ``attention_mask`` (and ``token_type_ids``
where the model takes them) → ``last_hidden_state`` (batch, seq, hidden).

A backend class also declares what the rest of the server asks about it without loading anything (like
TEI's ``Backend`` trait, kept small): its ``name`` and ``extra``, its spec ``Options``, the files it reads
(``files``: one answer for the folder check, ``backend: auto`` and the Hub download) and whether it can
serve a folder on a device (``can_serve``). ``core/backends/catalog.py`` lists the backends.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Collection, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict

from core.errors import Unsupported

if TYPE_CHECKING:
    from core.config import ModelSpec


class BackendOptions(BaseModel):
    """The spec options only one backend reads, nested under its name (``onnx: {workers: 2}``). ``flat``:
    the older top-level spec keys that still set them (``workers`` → ``onnx.workers``)."""

    model_config = ConfigDict(extra="forbid")

    #: top-level spec key → this model's field
    flat: ClassVar[dict[str, str]] = {}

    def in_folder(self, folder: Path) -> "BackendOptions":
        """These options with paths relative to the model folder resolved against ``folder`` (a local folder,
        or a Hub snapshot once fetched). Default: nothing to resolve."""
        return self


@dataclass(frozen=True)
class Folder:
    """What ``backend: auto`` knows of a model folder when it asks each backend ``can_serve``."""

    path: Path
    #: its files, relative, '/'-separated (as a Hub repository lists them)
    files: frozenset[str]
    #: the model's own code its config names (``core.loading.custom_code``), or None
    own_code: str | None = None
    #: the folder holds weights the fallback backend (torch) runs
    has_fallback_weights: bool = True


def folder_files(folder: Path) -> frozenset[str]:
    """The files under ``folder``, relative and '/'-separated: the listing ``Backend.files`` reads."""
    folder = Path(folder)
    found = []
    for root, _dirs, names in os.walk(folder):
        rel = Path(root).relative_to(folder)
        found += [(rel / n).as_posix() for n in names]
    return frozenset(found)


def device_kind(device: str) -> str:
    """``cuda:1`` → ``cuda``."""
    return device.partition(":")[0]


class Backend:
    """The base every backend derives from (like TEI's ``Backend`` trait): subclasses implement
    ``from_spec``, ``load`` and ``run``, and declare ``name``, ``extra`` and ``files``; the limits and
    ``describe`` have these defaults. The engine reads a backend's limits from here and nowhere else
    (``Engine.max_batch_size``)."""

    name: ClassVar[str]
    #: the pip extra that installs its runtime (``pip install -e '.[EXTRA]'``), named when it is missing
    extra: ClassVar[str]
    #: the Python package of its runtime (``installed`` looks for it without importing it)
    runtime: ClassVar[str | None] = None
    #: the spec options only it reads, as ``spec.<name>`` (None: it has none)
    Options: ClassVar[type[BackendOptions] | None] = None
    #: its place in ``backend: auto``'s questions, lowest first; None: auto's fallback (torch), asked last
    auto_order: ClassVar[int | None] = None
    #: what its artifacts are called in messages ("ONNX graph", "CTranslate2 model")
    artifact_label: ClassVar[str] = "artifact"
    #: the script that converts a model with its own code into its artifact (``--trust-remote-code``) and
    #: records it in ``parity.json``; None: not converted from the model's code (nothing to check)
    own_code_converter: ClassVar[str | None] = None

    #: it runs the attention mask it is given, so a position can be kept but not attended; False: it takes
    #: each row's length instead (CTranslate2), and attends every position up to it
    masks_attention: ClassVar[bool] = True
    #: it runs a model with task adapters without a task named (the model's own default); False: every
    #: request names its task (an exported ONNX graph takes a task id and holds no path without one)
    default_adapter: ClassVar[bool] = True

    #: fixed compiled batch size (Neuron), or None for dynamic shapes (the spec's ``max_batch_size`` applies)
    max_batch_size: int | None = None
    #: longest sequence it can run (static shapes), or None (the model's own maximum applies)
    max_sequence_length: int | None = None
    #: how many ``run`` calls it takes at once from different threads
    lanes: int = 1
    #: asked as a batch starts, on the thread that runs it: should the batch leave threads for other work rather
    #: than take every thread (set by the engine: its batcher's ``should_share_threads``)? A backend with more
    #: than one way to run a batch may pick by it (ONNX Runtime: all threads, or a lane's share). None: not known
    #: (no engine), every batch is on its own
    share_threads: Callable[[], bool] | None = None

    # --- declarations: read without loading a model ------------------------------------------------
    @classmethod
    def files(cls, listing: Collection[str], *, dtype: str, options: BackendOptions | None) -> list[str]:
        """The paths of ``listing`` (a model folder's or a Hub repository's files, relative, '/'-separated)
        this backend reads besides the configs and tokenizers every backend reads, its artifact first;
        empty when the listing has nothing it runs at this dtype. The folder check, ``backend: auto`` and
        the Hub download (``core.hub.select_files``) all ask this."""
        raise NotImplementedError

    @classmethod
    def missing_files(cls, where: str, *, dtype: str, options: BackendOptions | None) -> str:
        """The message when ``files`` found nothing in ``where`` for an explicit ``backend``."""
        return f"{where} has no {cls.artifact_label} for the {cls.name} backend"

    @classmethod
    def artifact(cls, folder: Path, *, dtype: str, options: BackendOptions | None,
                 listing: Collection[str] | None = None) -> Path | None:
        """The file of ``folder`` this backend runs for ``dtype`` (the first of ``files``), or None."""
        found = cls.files(folder_files(folder) if listing is None else listing, dtype=dtype, options=options)
        return Path(folder) / found[0] if found else None

    @classmethod
    def options_of(cls, spec: "ModelSpec") -> BackendOptions | None:
        """The spec's options for this backend (``spec.<name>``), or None when it declares none."""
        return getattr(spec, cls.name) if cls.Options is not None else None

    @classmethod
    def installed(cls) -> bool:
        """Its runtime is importable here (looked for, not imported)."""
        return cls.runtime is None or importlib.util.find_spec(cls.runtime) is not None

    @classmethod
    def can_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        """``backend: auto``'s question: why this backend serves ``folder`` on ``spec.device`` at
        ``spec.dtype`` from what the folder holds, or None when it does not. May raise ``InvalidInput`` when
        the device can be served by nothing else. Default: the folder has its artifact (and, for a model
        with its own code, one converted from that code)."""
        path = cls.artifact(folder.path, dtype=spec.dtype, options=cls.options_of(spec), listing=folder.files)
        if path is None or (folder.own_code is not None and not cls.converted_from_own_code(spec, path)):
            return None
        return f"{cls.artifact_label} in the folder ({path.relative_to(folder.path)})"

    @classmethod
    def converted_from_own_code(cls, spec: "ModelSpec", artifact: Path) -> bool:
        """For a model with its own code: ``artifact`` may serve it (its ``parity.json`` names that code)."""
        from core.loading import checked_with_own_code

        return cls.own_code_converter is not None and checked_with_own_code(artifact)

    @classmethod
    def cannot_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        """Why the folder's artifacts of this backend do not serve this spec (another precision, another
        device), or None. ``auto`` raises it when the folder has nothing else to serve."""
        return None

    @classmethod
    def check_spec(cls, spec: "ModelSpec") -> None:
        """An explicit ``backend: NAME``: raise ``InvalidInput`` naming what the folder lacks, before loading."""

    # --- a loaded model ---------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: "ModelSpec", artifact: Path | None = None) -> "Backend":
        """Build an unloaded backend for a model spec (reads only what it needs from the spec).
        ``artifact``: the file to run when it is not the folder's own (the export cache's graph)."""
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

    @classmethod
    def cpu_stage(cls, dtype: str) -> str | None:
        """The dtype a model meant for an accelerator at ``dtype`` is loaded with on the CPU, to be moved there
        later (``to_device``; Modal's memory snapshot has no GPU), or None when a loaded model cannot move
        (the default)."""
        return None

    def describe(self) -> dict:
        """What ``/v1/models`` shows of it (runtime, device, dtype, providers)."""
        return {"backend": self.name}
