"""Static-shape buckets, for runtimes that only run the shapes they were compiled for (AWS Neuron).

Pure numpy, no accelerator import: everything here is tested on CPU by driving it with ONNX Runtime
graphs exported with the same fixed shapes (``tests/backends/``).

- :func:`plan_buckets`: batch sizes × sequence lengths → the buckets to compile.
- :class:`Manifest`: ``manifest.json`` beside the compiled buckets (format below).
- :func:`choose_bucket`: the smallest bucket (fewest padded tokens) that fits a batch.
- :class:`BucketRouter`: runs a dynamic batch on static buckets: splits a batch larger than the largest
  compiled batch, pads each part to its bucket's shape, calls that bucket, strips the padding, and
  returns outputs shaped as a dynamic runtime returns them (batch, longest input, ...).
- :class:`BucketedBackend`: the Backend contract on top of a manifest and a router; a runtime
  (``core/backends/neuron.py``) only says how one compiled bucket is loaded and called.

Manifest (``<folder>/neuron/manifest.json``)::

    {"format": 1, "runtime": "neuron", "head": "encoder", "source": "all-MiniLM-L6-v2",
     "dtype": "bf16", "inputs": ["input_ids", "attention_mask", "token_type_ids"],
     "buckets": [{"batch_size": 1, "sequence_length": 128, "path": "b1_s128"}, ...]}

``path`` is relative to the manifest's folder. Inputs longer than the largest compiled sequence length
are refused (``TooLarge``) or truncated, as the router is told; the engine caps the tokenizer at that
length, so a request's own ``truncate`` flag decides before anything reaches the router.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Mapping

import numpy as np

from core.backends.base import Backend
from core.errors import BackendFailure, InvalidInput, TooLarge

MANIFEST_FORMAT = 1
MANIFEST_NAME = "manifest.json"

#: value a padded position gets, per input name (input_ids: the tokenizer's pad id, given at run time)
PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0}


@dataclass(frozen=True)
class Bucket:
    """One compiled static shape. Buckets sort by sequence length, then batch size."""

    batch_size: int
    sequence_length: int

    def __lt__(self, other: "Bucket") -> bool:
        return (self.sequence_length, self.batch_size) < (other.sequence_length, other.batch_size)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.sequence_length

    @property
    def dirname(self) -> str:
        return f"b{self.batch_size}_s{self.sequence_length}"

    def fits(self, n: int, length: int) -> bool:
        return n <= self.batch_size and length <= self.sequence_length


def plan_buckets(batch_sizes: Iterable[int], sequence_lengths: Iterable[int], *,
                 max_positions: int | None = None) -> list[Bucket]:
    """Every batch size × sequence length, sorted by sequence length then batch size.

    Refuses non-positive or duplicate sizes and sequence lengths beyond the model's position table."""
    batches, lengths = list(batch_sizes), list(sequence_lengths)
    for label, values in (("batch size", batches), ("sequence length", lengths)):
        if not values:
            raise InvalidInput(f"bucket plan: give at least one {label}")
        if any(int(v) != v or v <= 0 for v in values):
            raise InvalidInput(f"bucket plan: every {label} must be a positive integer, got {values}")
        if len(set(values)) != len(values):
            raise InvalidInput(f"bucket plan: duplicate {label} in {values}")
    if max_positions is not None and max(lengths) > max_positions:
        raise InvalidInput(
            f"bucket plan: sequence length {max(lengths)} exceeds the model's {max_positions} positions"
        )
    return sorted(Bucket(int(b), int(s)) for s, b in itertools.product(lengths, batches))


def choose_bucket(buckets: Iterable[Bucket], n: int, length: int) -> Bucket | None:
    """The bucket with the fewest padded tokens that holds ``n`` items of ``length`` tokens (ties: the
    shorter sequence), or None when none does."""
    fitting = [b for b in buckets if b.fits(n, length)]
    return min(fitting, key=lambda b: (b.tokens, b.sequence_length)) if fitting else None


@dataclass(frozen=True)
class ManifestEntry:
    bucket: Bucket
    path: str


@dataclass
class Manifest:
    entries: list[ManifestEntry]
    runtime: str = "neuron"
    head: str = "encoder"
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")
    source: str | None = None
    dtype: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def buckets(self) -> list[Bucket]:
        return [e.bucket for e in self.entries]

    def to_json(self) -> dict:
        return {
            "format": MANIFEST_FORMAT, "runtime": self.runtime, "head": self.head, "source": self.source,
            "dtype": self.dtype, "inputs": list(self.inputs),
            "buckets": [{"batch_size": e.bucket.batch_size, "sequence_length": e.bucket.sequence_length,
                         "path": e.path} for e in self.entries],
            **({"extra": self.extra} if self.extra else {}),
        }

    def write(self, folder: Path) -> Path:
        path = Path(folder) / MANIFEST_NAME
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> "Manifest":
        path = Path(folder) / MANIFEST_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise InvalidInput(f"no bucket manifest at {path}: compile the model first "
                               "(python scripts/compile_neuron.py MODEL OUT)") from None
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise InvalidInput(f"{path}: unknown manifest format {data.get('format') if isinstance(data, dict) else data!r}"
                               f" (this version reads format {MANIFEST_FORMAT})")
        try:
            entries = [ManifestEntry(Bucket(int(b["batch_size"]), int(b["sequence_length"])), str(b["path"]))
                       for b in data["buckets"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(f"{path}: malformed bucket entry ({exc!r})") from None
        if not entries:
            raise InvalidInput(f"{path}: the manifest lists no buckets")
        if len({e.bucket for e in entries}) != len(entries):
            raise InvalidInput(f"{path}: duplicate buckets")
        if any(b.batch_size <= 0 or b.sequence_length <= 0 for b in (e.bucket for e in entries)):
            raise InvalidInput(f"{path}: bucket sizes must be positive")
        return cls(entries=sorted(entries, key=lambda e: e.bucket), runtime=str(data.get("runtime", "neuron")),
                   head=str(data.get("head", "encoder")), inputs=tuple(data.get("inputs") or cls.inputs),
                   source=data.get("source"), dtype=data.get("dtype"), extra=dict(data.get("extra") or {}))


def pad_to_bucket(inputs: Mapping[str, np.ndarray], bucket: Bucket, pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad (n, L) arrays to the bucket's (batch_size, sequence_length). Filler rows get one
    attended pad token so no row is fully masked (some kernels give NaN for an all-masked row)."""
    out = {}
    for name, array in inputs.items():
        n, length = array.shape
        if n > bucket.batch_size or length > bucket.sequence_length:
            raise BackendFailure(f"{name} {array.shape} does not fit bucket {bucket}")
        fill = pad_id if name == "input_ids" else PAD_VALUES.get(name, 0)
        padded = np.full((bucket.batch_size, bucket.sequence_length), fill, dtype=array.dtype)
        padded[:n, :length] = array
        if name == "attention_mask" and n < bucket.batch_size:
            padded[n:, 0] = 1
        out[name] = padded
    return out


def strip_padding(outputs: Mapping[str, np.ndarray], n: int, length: int, bucket: Bucket) -> dict[str, np.ndarray]:
    """Drop filler rows, and filler positions of per-token outputs (axis 1 of the bucket's length)."""
    out = {}
    for name, array in outputs.items():
        if array.shape[0] != bucket.batch_size:
            raise BackendFailure(f"bucket {bucket}: output {name} has batch {array.shape[0]}")
        array = array[:n]
        if array.ndim >= 3 and array.shape[1] == bucket.sequence_length:
            array = array[:, :length]
        out[name] = array
    return out


BucketRunner = Callable[[Bucket, dict[str, np.ndarray]], Mapping[str, np.ndarray]]


class BucketRouter:
    """Runs dynamic (n, L) batches on static buckets. ``run_bucket(bucket, padded_inputs)`` calls the
    runtime compiled for exactly that bucket."""

    def __init__(self, buckets: Iterable[Bucket], run_bucket: BucketRunner, *, pad_id: int = 0,
                 overflow: str = "refuse") -> None:
        self.buckets = sorted(set(buckets))
        if not self.buckets:
            raise InvalidInput("no buckets to route to")
        if overflow not in ("refuse", "truncate"):
            raise InvalidInput(f"overflow must be 'refuse' or 'truncate', not {overflow!r}")
        self._run_bucket = run_bucket
        self.pad_id = pad_id
        self.overflow = overflow
        #: bucket → calls served (for describe() and tests)
        self.calls: dict[Bucket, int] = {b: 0 for b in self.buckets}
        self.padded_tokens = 0
        self.real_tokens = 0

    @property
    def max_batch_size(self) -> int:
        return max(b.batch_size for b in self.buckets)

    @property
    def max_sequence_length(self) -> int:
        return max(b.sequence_length for b in self.buckets)

    def plan(self, lengths: np.ndarray) -> list[tuple[slice, Bucket]]:
        """Split rows into consecutive parts of at most the largest batch (the longest sequence's buckets
        may hold fewer items), and give each part its smallest fitting bucket."""
        lengths = np.asarray(lengths)
        too_long = np.flatnonzero(lengths > self.max_sequence_length)
        if too_long.size and self.overflow == "refuse":
            i = int(too_long[0])
            raise TooLarge(
                f"input[{i}] has {int(lengths[i])} tokens; the compiled buckets take at most "
                f"{self.max_sequence_length}; send shorter text or set truncate=true",
                param="input", code="input_too_long",
            )
        lengths = np.minimum(lengths, self.max_sequence_length)
        parts, start, n = [], 0, len(lengths)
        while start < n:
            # the largest batch a bucket of the needed length takes, growing the part while it fits
            end = start + 1
            longest = int(lengths[start])
            while end < n:
                cand = max(longest, int(lengths[end]))
                if choose_bucket(self.buckets, end - start + 1, cand) is None:
                    break
                longest, end = cand, end + 1
            bucket = choose_bucket(self.buckets, end - start, longest)
            parts.append((slice(start, end), bucket))
            start = end
        return parts

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        mask = inputs["attention_mask"]
        n, width = mask.shape
        lengths = mask.sum(axis=1).astype(np.int64)
        results: list[dict[str, np.ndarray]] = []
        for rows, bucket in self.plan(lengths):
            length = min(int(lengths[rows].max()), bucket.sequence_length)
            part = {k: v[rows, :length] for k, v in inputs.items()}
            padded = pad_to_bucket(part, bucket, self.pad_id)
            outputs = self._run_bucket(bucket, padded)
            self.calls[bucket] += 1
            self.padded_tokens += bucket.tokens
            self.real_tokens += int(lengths[rows].clip(max=bucket.sequence_length).sum())
            results.append(strip_padding(outputs, rows.stop - rows.start, length, bucket))
        return _concat(results, width=min(width, self.max_sequence_length))


def _concat(parts: list[dict[str, np.ndarray]], width: int) -> dict[str, np.ndarray]:
    """Join parts along the batch; per-token outputs are zero-padded to the batch's common width."""
    out = {}
    for name in parts[0]:
        arrays = [p[name] for p in parts]
        if arrays[0].ndim >= 3:
            arrays = [np.pad(a, [(0, 0), (0, width - a.shape[1])] + [(0, 0)] * (a.ndim - 2)) for a in arrays]
        out[name] = np.concatenate(arrays, axis=0)
    return out


class BucketedBackend(Backend):
    """Backend contract over compiled buckets listed in a manifest. Subclasses load one bucket."""

    name: ClassVar[str] = "bucketed"
    #: subfolder of a model folder that holds the manifest and the compiled buckets
    subdir: ClassVar[str] = "neuron"

    def __init__(self, manifest_dir: Path | None = None) -> None:
        self.manifest_dir = manifest_dir
        self.manifest: Manifest | None = None
        self.router: BucketRouter | None = None
        self.max_batch_size: int | None = None
        self.max_sequence_length: int | None = None
        self._device, self._dtype = "cpu", "float32"
        if manifest_dir is not None and (Path(manifest_dir) / MANIFEST_NAME).exists():
            self._read_manifest(Path(manifest_dir))

    @classmethod
    def from_spec(cls, spec, artifact: Path | None = None) -> "BucketedBackend":
        """Reads the manifest now, so the engine knows the largest batch and sequence before loading."""
        return cls(cls.manifest_dir_for(spec.path))

    @classmethod
    def manifest_dir_for(cls, model_dir: Path) -> Path:
        for candidate in (Path(model_dir) / cls.subdir, Path(model_dir)):
            if (candidate / MANIFEST_NAME).exists():
                return candidate
        return Path(model_dir) / cls.subdir

    def _read_manifest(self, folder: Path) -> Manifest:
        self.manifest = Manifest.read(folder)
        self.max_batch_size = max(b.batch_size for b in self.manifest.buckets)
        self.max_sequence_length = max(b.sequence_length for b in self.manifest.buckets)
        return self.manifest

    # what a runtime provides ------------------------------------------------------------------
    def load_bucket(self, path: Path, bucket: Bucket, *, device: str, threads: int):
        """Load one compiled bucket; returns a callable ``padded inputs → named outputs``."""
        raise NotImplementedError

    # Backend contract ---------------------------------------------------------------------------
    def load(self, model_dir: Path, *, head: str, device: str, dtype: str, threads: int) -> None:
        from core.tokenization import TextTokenizer

        folder = Path(self.manifest_dir or self.manifest_dir_for(model_dir))
        manifest = self._read_manifest(folder)
        if manifest.head != head:
            raise InvalidInput(f"{folder}: buckets were compiled for head {manifest.head!r}, the task needs {head!r}")
        runners = {e.bucket: self.load_bucket(folder / e.path, e.bucket, device=device, threads=threads)
                   for e in manifest.entries}
        wanted = set(manifest.inputs)

        def run_bucket(bucket: Bucket, padded: dict[str, np.ndarray]) -> Mapping[str, np.ndarray]:
            return runners[bucket]({k: v for k, v in padded.items() if k in wanted})

        pad_id = TextTokenizer(Path(model_dir), 10**6).pad_id if (Path(model_dir) / "tokenizer.json").exists() else 0
        self.router = BucketRouter(manifest.buckets, run_bucket, pad_id=pad_id)
        self.manifest_dir = folder
        self._device, self._dtype = device, manifest.dtype or dtype

    def run(self, inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        if self.router is None:
            raise BackendFailure(f"{self.name} backend used before load()")
        outputs = self.router.run(inputs)
        return {k: v if v.dtype == np.float32 else v.astype(np.float32) for k, v in outputs.items()}

    def describe(self) -> dict:
        buckets = [f"{b.batch_size}x{b.sequence_length}" for b in (self.manifest.buckets if self.manifest else [])]
        return {"backend": self.name, "device": self._device, "dtype": self._dtype, "buckets": buckets}
