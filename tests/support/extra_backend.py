"""A backend declared outside ``core``, shaped as an OpenVINO backend would be (``openvino/openvino_model.xml``
and ``.bin``, an option of its own), for the test that a new backend is one module plus one line of
``core/backends/catalog.py``: it is listed, its options nest in the spec, ``auto`` asks it and the Hub
download fetches its files. Its runtime is not installed here: loading it names its extra."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Collection

from pydantic import Field

from core.backends.base import Backend, BackendOptions
from core.errors import require


class ExtraOptions(BackendOptions):
    performance_hint: str = Field(default="LATENCY", description="LATENCY | THROUGHPUT")


class ExtraBackend(Backend):
    name: ClassVar[str] = "openvino"
    extra: ClassVar[str] = "openvino"
    runtime: ClassVar[str | None] = "openvino"
    Options = ExtraOptions
    auto_order: ClassVar[int | None] = 15
    artifact_label: ClassVar[str] = "OpenVINO model"

    @classmethod
    def files(cls, listing: Collection[str], *, dtype: str, options: BackendOptions | None) -> list[str]:
        main = "openvino/openvino_model.xml"
        if main not in listing:
            return []
        return [main, *sorted(f for f in listing if f.startswith("openvino/") and f != main)]

    @classmethod
    def from_spec(cls, spec, artifact: Path | None = None) -> "ExtraBackend":
        backend = cls()
        backend.hint = spec.openvino.performance_hint
        return backend

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        require("openvino", self.extra)
