"""ONNX Runtime backend. Imports no torch, so it serves in the Lambda image.

The graphs a folder (or a Hub repository) may carry are declared here (``ONNX_GRAPHS``): the folder check,
``backend: auto`` and the Hub download read them through ``OnnxBackend.files``.
"""

from __future__ import annotations

import threading
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar, Collection, Literal, Mapping

import numpy as np
from pydantic import Field

from core.backends.base import Backend, BackendOptions, Folder
from core.backends.heads import get_head
from core.errors import BackendFailure, InvalidInput, OutOfMemory, require

if TYPE_CHECKING:
    from core.config import ModelSpec


ONNX_DTYPES = frozenset({"float32", "fp32", "int8", "float16", "fp16"})

#: execution providers a device name maps to, most preferred first (CPU is always the fallback)
DEVICE_PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}

#: the graphs a folder may carry per dtype, in the order they are looked for
ONNX_GRAPHS: dict[str, tuple[str, ...]] = {
    "int8": ("onnx/model_int8.onnx", "onnx/model_quantized.onnx", "model_int8.onnx", "model_quantized.onnx"),
    "float16": ("onnx/model_fp16.onnx", "model_fp16.onnx"),
    "float32": ("onnx/model.onnx", "model.onnx"),
}
#: dtype spellings that name one of ``ONNX_GRAPHS``' dtypes
ONNX_DTYPE_ALIASES = {"fp16": "float16", "fp32": "float32"}


def onnx_graph_names(dtype: str) -> tuple[str, ...]:
    """The ONNX graphs looked for in a model folder (or a Hub repository) for ``dtype``, first choice first
    (none for a dtype ONNX graphs do not come in)."""
    return ONNX_GRAPHS.get(ONNX_DTYPE_ALIASES.get(dtype, dtype), ())


class OnnxOptions(BackendOptions):
    """``onnx:`` in a model spec."""

    file: Path | None = Field(
        default=None, description="ONNX graph to run, relative to the model folder unless absolute; default: the "
        "folder's graph for the dtype (onnx/model.onnx, model.onnx; int8: onnx/model_int8.onnx)")
    workers: int | None = Field(
        default=None, gt=0, le=64,
        description="batches run at once; default: 2 on CPU with 2+ threads, else 1. With 2, a batch that starts "
        "while another runs, or with a full batch queued behind it (or any work behind a batch of a size known to be "
        "cheap), gets threads/2 threads of its own (a second session: one more copy of the weights in memory); "
        "any other keeps them all: two batches keep two cores busy where one session's threads would wait for each "
        "other, and a lone batch keeps both busy while the partial batch behind it waits")
    spin: bool | Literal["run"] = Field(
        default="run", description="let ONNX Runtime's threads busy-wait for work: true between runs too (ONNX "
        "Runtime's own default), \"run\" only while a run is in progress (they stop when the last concurrent run "
        "returns: no CPU spent spinning between requests), false never (that CPU goes to tokenization and the event "
        "loop). \"run\" measured 0.63x the CPU per one-text request of true on a near-free model, with no latency "
        "or throughput loss on all-MiniLM-L6-v2 (docs/bench/history.md, ONNX Runtime spinning)")
    optimized: bool = Field(
        default=False, description="the graph is ONNX Runtime's own optimized graph, written ahead of time (python -m "
        "core.convert.ort_optimized; the Lambda image does): load it with graph optimizations off, skipping their "
        "cost at start-up")
    providers: list[str] | None = Field(default=None, description="execution providers in order (default: from device)")

    flat = {"onnx_file": "file", "workers": "workers", "ort_spin": "spin", "ort_optimized": "optimized",
            "providers": "providers"}

    def in_folder(self, folder: Path) -> "OnnxOptions":
        """A relative ``file`` names a file of the model folder, not of the working directory."""
        if self.file is None or self.file.is_absolute():
            return self
        return self.model_copy(update={"file": Path(folder) / self.file})


def graph_for(spec: "ModelSpec") -> Path | None:
    """The ONNX graph a spec points at, if any: ``onnx.file`` (relative paths are resolved against the
    model folder), else the folder's graph for the dtype (``ONNX_GRAPHS``): ``onnx/model.onnx`` or
    ``model.onnx``; ``dtype: int8`` → ``onnx/model_int8.onnx`` / ``onnx/model_quantized.onnx``;
    ``float16`` → ``onnx/model_fp16.onnx``. Never a graph of another precision."""
    if spec.onnx.file is not None:
        return Path(spec.onnx.file)
    for candidate in (spec.path / name for name in onnx_graph_names(spec.dtype)):
        if candidate.exists():
            return candidate
    return None


def missing_graph_message(spec: "ModelSpec") -> str:
    """What is missing for ``backend: onnx`` at this dtype, and the command that makes it."""
    return _missing_graph(spec.served_name, spec.path, spec.dtype, spec.onnx.file)


def _missing_graph(name: str, folder: Path, dtype: str, file: Path | None) -> str:
    dtype = ONNX_DTYPE_ALIASES.get(dtype, dtype)
    if file is not None:
        return f"model {name!r}: onnx_file {file} does not exist"
    names = onnx_graph_names(dtype)
    flag = {"int8": " --int8 fast", "float16": " --fp16"}.get(dtype, "")
    have = [n for graphs in ONNX_GRAPHS.values() for n in graphs if (folder / n).exists()]
    found = f"; the folder has {', '.join(have)} (another precision)" if have else ""
    short = {"float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
    return (f"model {name!r}: no {short} ONNX graph in {folder} (looked for {', '.join(names)}){found}; "
            f"make one with `python scripts/export_onnx.py {folder} OUT{flag}` and serve OUT, "
            f"or name a graph with onnx_file")


def _providers(ort, device: str, requested: list[str] | None = None) -> list:
    """The providers a session gets: ``requested`` (spec ``providers``, e.g. TensorRT first) or the device's.
    Each must be in this onnxruntime build; CUDA/TensorRT come with ``onnxruntime-gpu``."""
    available = ort.get_available_providers()
    kind, _, index = device.partition(":")
    if requested is None:
        if kind not in DEVICE_PROVIDERS:
            raise InvalidInput(f"onnx backend: unknown device {device!r}; use cpu or cuda[:N]")
        requested = DEVICE_PROVIDERS[kind]
    missing = [p for p in requested if p not in available]
    if missing:
        raise InvalidInput(
            f"onnx backend: execution providers {missing} are not in this onnxruntime (available: {available}); "
            "CUDA/TensorRT need `pip install onnxruntime-gpu` (instead of onnxruntime) and a GPU"
        )
    if kind == "cuda" and index:  # pin GPU providers to the device index
        return [(p, {"device_id": int(index)}) if p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
                else p for p in requested]
    return list(requested)


class OnnxBackend(Backend):
    name: ClassVar[str] = "onnx"
    extra: ClassVar[str] = "onnx"
    runtime: ClassVar[str | None] = "onnxruntime"
    Options = OnnxOptions
    auto_order: ClassVar[int | None] = 10
    artifact_label: ClassVar[str] = "ONNX graph"
    own_code_converter: ClassVar[str | None] = "scripts/export_onnx.py"
    default_adapter: ClassVar[bool] = False
    max_batch_size: int | None = None

    @classmethod
    def files(cls, listing: Collection[str], *, dtype: str, options: BackendOptions | None) -> list[str]:
        """The graph for ``dtype`` (or the one ``onnx.file`` names), its external data (``model.onnx_data``,
        ``model.onnx.data``) and the exporter's record of the code it came from (``parity.json``)."""
        file = options.file if isinstance(options, OnnxOptions) else None
        names = (PurePosixPath(file).as_posix(),) if file is not None else onnx_graph_names(dtype)
        graph = next((name for name in names if name in listing), None)
        if graph is None:
            return []
        record = (PurePosixPath(graph).parent / "parity.json").as_posix()
        return [graph, *sorted(f for f in listing if f.startswith((graph + "_data", graph + ".data")) or f == record)]

    @classmethod
    def missing_files(cls, where: str, *, dtype: str, options: BackendOptions | None) -> str:
        file = options.file if isinstance(options, OnnxOptions) else None
        wanted = [PurePosixPath(file).as_posix()] if file is not None else list(onnx_graph_names(dtype))
        return (f"{where} has no ONNX graph for dtype {dtype} (looked for {wanted}); serve it with backend torch, "
                "or export one with scripts/export_onnx.py")

    @classmethod
    def artifact(cls, folder: Path, *, dtype: str, options: BackendOptions | None,
                 listing: Collection[str] | None = None) -> Path | None:
        """The graph ``onnx.file`` names (wherever it is), else the folder's graph for ``dtype``."""
        if isinstance(options, OnnxOptions) and options.file is not None and Path(options.file).is_absolute():
            return Path(options.file)
        return super().artifact(folder, dtype=dtype, options=options, listing=listing)

    @classmethod
    def converted_from_own_code(cls, spec: "ModelSpec", artifact: Path) -> bool:
        """A graph the spec names (e.g. the model publisher's own export) is taken as made from the model's code."""
        return spec.onnx.file is not None or super().converted_from_own_code(spec, artifact)

    @classmethod
    def can_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        graph = graph_for(spec)
        if graph is None:
            return None
        if folder.own_code is not None:
            if not cls.converted_from_own_code(spec, graph):
                return None
            return (f"the model runs its own code ({folder.own_code}) and the folder's ONNX graph was exported from "
                    f"it ({graph.name}, parity.json)")
        shown = graph.relative_to(spec.path) if graph.is_relative_to(spec.path) else graph
        return f"the folder has an ONNX graph for {spec.dtype} ({shown})"

    @classmethod
    def cannot_serve(cls, spec: "ModelSpec", folder: Folder) -> str | None:
        """Graphs of another precision only."""
        if any(n in folder.files for graphs in ONNX_GRAPHS.values() for n in graphs):
            return missing_graph_message(spec)
        return None

    @classmethod
    def check_spec(cls, spec: "ModelSpec") -> None:
        if not onnx_graph_names(spec.dtype):
            raise InvalidInput(f"onnx backend: dtype {spec.dtype!r} not supported; use one of "
                               f"{sorted([*ONNX_GRAPHS, *ONNX_DTYPE_ALIASES])}")
        if graph_for(spec) is None:
            raise InvalidInput(missing_graph_message(spec))

    @classmethod
    def from_spec(cls, spec: "ModelSpec", artifact: Path | None = None) -> "OnnxBackend":
        options = spec.onnx
        return cls(onnx_file=artifact or graph_for(spec), providers=options.providers, spin=options.spin,
                   lanes=options.workers, optimized=options.optimized)

    def __init__(self, onnx_file: Path | None = None, providers: list[str] | None = None, spin: bool | str = "run",
                 lanes: int | None = None, optimized: bool = False) -> None:
        self._onnx_file = onnx_file
        self._optimized = optimized
        self._requested = providers
        self._spin = spin
        self.lanes = lanes
        self._runtime_error: type[Exception] = RuntimeError
        self._session = None
        self._shared = None  # the session runs use while another run is in flight (lanes > 1)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._inputs: frozenset[str] = frozenset()
        self._outputs: list[str] = []
        self._device = "cpu"
        self._dtype = "float32"

    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        ort = require("onnxruntime", "onnx")
        from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

        self._runtime_error = RuntimeException
        if dtype not in ONNX_DTYPES:
            raise InvalidInput(f"onnx backend: dtype {dtype!r} not supported; use one of {sorted(ONNX_DTYPES)}")
        path = self._onnx_file
        if path is None:  # the folder's graph of this precision, never one of another
            folder = Path(model_dir)
            path = next((folder / n for n in onnx_graph_names(dtype) if (folder / n).exists()), None)
            if path is None:
                raise InvalidInput(_missing_graph(folder.name, folder, dtype, None))
        if not Path(path).exists():
            raise InvalidInput(
                f"no ONNX graph at {path}: export one with `python scripts/export_onnx.py {model_dir} OUT`"
            )
        providers = _providers(ort, device, self._requested)
        self._session = self._new_session(ort, path, providers, threads)
        if self.lanes is None:  # auto: overlap batches where there are cores to overlap on
            self.lanes = 2 if device == "cpu" and threads >= 2 else 1
        if self.lanes > 1:
            # Batches that overlap each run on threads/lanes threads of their own: no intra-op barrier
            # shared with a thread the OS has lent to HTTP or tokenization, no pool spinning between them.
            # A batch that runs alone (light load) keeps every thread, so single-request latency is not paid.
            self._shared = self._new_session(ort, path, providers, max(1, threads // self.lanes))
        self._inputs = frozenset(i.name for i in self._session.get_inputs())
        outputs = [o.name for o in self._session.get_outputs()]
        wanted = list(get_head(head).outputs)
        missing = [w for w in wanted if w not in outputs]
        if missing:
            raise InvalidInput(f"{path}: ONNX graph lacks outputs {missing} for head {head!r} (has {outputs})")
        self._outputs, self._device, self._dtype = wanted, device, dtype
        self._onnx_file = Path(path)

    def _new_session(self, ort, path: Path, providers: list, threads: int):
        opts = ort.SessionOptions()
        # a graph written by core.convert.ort_optimized is optimized already: loading it skips that work
        opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_DISABLE_ALL if self._optimized
                                         else ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # busy-waiting between ops/runs (ONNX Runtime's default) lowers a small request's latency;
        # ort_spin: false gives that CPU to tokenization and the event loop instead; "run" spins between the
        # ops of a run only (the pool stops spinning when the last concurrent run returns)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if self._spin else "0")
        if self._spin == "run":
            opts.add_session_config_entry("session.force_spinning_stop", "1")
        return ort.InferenceSession(str(path), sess_options=opts, providers=providers)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self._session is None:
            raise BackendFailure("onnx backend used before load()")
        feeds = {k: v for k, v in inputs.items() if k in self._inputs}
        # every thread for a batch that runs alone (a light load's latency; a partial batch queued behind it waits
        # for it to end); a lane's share of them while another batch runs or the batcher says to share (another
        # batch is about to start beside it, or it is a cheap batch with work waiting behind it): batches
        # in parallel, each on its own threads, use the cores better than threads that split one small batch and
        # spin between its ops
        with self._lock:
            alone = self._in_flight == 0 and (self.share_threads is None or not self.share_threads())
            session = self._session if alone or self._shared is None else self._shared
            self._in_flight += 1
        try:
            results = session.run(self._outputs, feeds)
        except self._runtime_error as exc:  # an allocation failure is retried in halves by the engine
            if "alloc" in str(exc).lower():
                raise OutOfMemory(f"onnxruntime: {exc}") from exc
            raise
        finally:
            with self._lock:
                self._in_flight -= 1
        return {name: out if out.dtype == np.float32 else out.astype(np.float32)
                for name, out in zip(self._outputs, results)}

    @property
    def served_file(self) -> Path | None:
        """The graph this backend runs (part of the model's identity in the embedding cache, core/cache)."""
        return self._onnx_file

    def describe(self) -> dict:
        return {"backend": self.name, "device": self._device, "dtype": self._dtype,
                "file": self._onnx_file.name if self._onnx_file else None, "lanes": self.lanes,
                "providers": self._session.get_providers() if self._session is not None else None}
