"""Content-addressed cache of ONNX graphs exported from a model folder's torch weights.

``backend: auto`` on a CPU serves a folder that carries only torch weights through ONNX Runtime: the
head is exported once (``core/convert/onnx_export.py``), checked against the torch forward on probe
texts, and kept under the cache directory (``cache_dir``, env ``TESSERA_CACHE_DIR``)::

    <cache_dir>/onnx/<key>/model.onnx     the graph (and its external data, for large models)
    <cache_dir>/onnx/<key>/entry.json     what was exported, the versions, the parity figures
    <cache_dir>/onnx/<key>/failed.json    instead of the two above: why the export or its check failed
                                          (later starts fall back at once; delete the folder to retry)
    <cache_dir>/hashes.json               file digests memoized by (path, size, mtime), so a later start
                                          does not re-read gigabytes of weights

The key is the SHA-256 of: the contents of the files the export reads (``config.json`` and the
weight files), the exporter's version, the installed torch / transformers / onnx / onnxruntime
versions, and the options (head, dtype, opset). Versions are read from the installed distributions'
metadata, so a cache hit imports neither torch nor onnx.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.config import default_cache_dir  # noqa: F401  (re-exported: the cache's default place)
from core.torch_thread import on_torch_thread

log = logging.getLogger(__name__)

#: the heads ``core/convert/onnx_export.py`` exports (text inputs: ids, mask, token types)
EXPORTABLE_HEADS = frozenset({"encoder", "sequence-classification", "splade", "masked-lm"})
#: a graph is used only if every output's worst cosine against the torch forward reaches this (fp32)
PARITY_MIN_COSINE = 0.9999
#: and every row's norm is within this relative distance of torch's (cosine alone ignores scale)
PARITY_MAX_NORM_ERROR = 1e-3
DEFAULT_OPSET = 17
#: the file names whose contents an export reads (besides config.json)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
#: probe texts of different lengths (one batch, so padding and the mask are exercised)
PROBE_TEXTS = (
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "A content-addressed cache keys each entry by a hash of what produced it, so a changed input "
    "can never be served a stale result, and an unchanged one is reused on every later start.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich; 東京 3.14 #42 @user",
)
VERSIONED = ("torch", "transformers", "onnx", "onnxruntime")


class ExportUnavailable(Exception):
    """No graph can be had from the cache or an export; ``str()`` is the reason, for the log and the card."""


@dataclass(frozen=True)
class CachedGraph:
    path: Path
    key: str
    min_cosine: dict[str, float] = field(default_factory=dict)
    exported_now: bool = False


def has_torch_weights(folder: Path) -> bool:
    return any((Path(folder) / name).exists() for name in WEIGHT_FILES)


def _source_files(folder: Path) -> list[Path]:
    """config.json, the weight files and the shards an index names, sorted."""
    folder = Path(folder)
    files = [folder / "config.json"] + [folder / n for n in WEIGHT_FILES if (folder / n).exists()]
    for index in (folder / "model.safetensors.index.json", folder / "pytorch_model.bin.index.json"):
        if index.exists():
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
            files += [folder / s for s in sorted(shards)]
    return sorted(set(files))


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


class _Digests:
    """SHA-256 of files, memoized in ``hashes.json`` by (resolved path, size, mtime_ns)."""

    def __init__(self, cache_dir: Path):
        self._file = cache_dir / "hashes.json"
        try:
            self._memo = json.loads(self._file.read_text())
        except (OSError, ValueError):
            self._memo = {}
        self._dirty = False

    def digest(self, path: Path) -> str:
        path = path.resolve()
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        known = self._memo.get(str(path))
        if known and known[:2] == stamp:
            return known[2]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        self._memo[str(path)] = [*stamp, h.hexdigest()]
        self._dirty = True
        return h.hexdigest()

    def save(self) -> None:
        if self._dirty:
            try:
                write_json(self._file, self._memo)
            except OSError as exc:  # a read-only cache still serves; digests are recomputed next time
                log.debug("could not save %s: %s", self._file, exc)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def cache_key(folder: Path, *, head: str, cache_dir: Path, dtype: str = "float32",
              opset: int = DEFAULT_OPSET) -> tuple[str, dict]:
    """The entry's key and what it was computed from (written to ``entry.json``)."""
    from core.convert.onnx_export import EXPORTER_VERSION

    digests = _Digests(cache_dir)
    files = {p.name: digests.digest(p) for p in _source_files(folder)}
    digests.save()
    inputs = {"files": files, "exporter": EXPORTER_VERSION, "versions": _versions(),
              "head": head, "dtype": dtype, "opset": opset}
    blob = json.dumps(inputs, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:32], inputs


def entry_dir(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / "onnx" / key


def lookup(folder: Path, *, head: str, cache_dir: Path, dtype: str = "float32",
           opset: int = DEFAULT_OPSET) -> CachedGraph | None:
    """The cached graph for this folder and options, or None (not exported yet).
    Raises ``ExportUnavailable`` when an earlier export of the same inputs failed."""
    key, _ = cache_key(folder, head=head, cache_dir=cache_dir, dtype=dtype, opset=opset)
    entry = entry_dir(cache_dir, key)
    failed = entry / "failed.json"
    if failed.exists():
        reason = json.loads(failed.read_text()).get("reason", "unknown")
        raise ExportUnavailable(f"an earlier export of these files failed: {reason} (delete {entry} to retry)")
    meta = entry / "entry.json"
    if (entry / "model.onnx").exists() and meta.exists():
        data = json.loads(meta.read_text())
        return CachedGraph(entry / "model.onnx", key, data.get("min_cosine", {}))
    return None


def cached_or_export(folder: Path, *, head: str, cache_dir: Path, dtype: str = "float32",
                     opset: int = DEFAULT_OPSET, max_length: int | None = None, name: str | None = None) -> CachedGraph:
    """The folder's graph from the cache, else exported, checked and cached now. ``name``: the model's
    served name, in the log lines (default: the folder's name).
    Raises ``ExportUnavailable`` (with the reason) when no checked graph can be had."""
    folder, cache_dir = Path(folder), Path(cache_dir)
    if head not in EXPORTABLE_HEADS:
        raise ExportUnavailable(f"the exporter has no ONNX export for the {head!r} head")
    if dtype not in ("float32", "fp32"):
        raise ExportUnavailable(f"only float32 graphs are exported automatically (dtype {dtype!r})")
    if not has_torch_weights(folder):
        raise ExportUnavailable(f"{folder} has no torch weights to export ({' / '.join(WEIGHT_FILES[:2])})")
    found = lookup(folder, head=head, cache_dir=cache_dir, dtype="float32", opset=opset)
    if found is not None:
        return found
    missing = [m for m in ("torch", "transformers", "onnx", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        raise ExportUnavailable(f"exporting needs {', '.join(missing)}: pip install -e '.[export]'")
    key, inputs = cache_key(folder, head=head, cache_dir=cache_dir, dtype="float32", opset=opset)
    # torch's CPU work in one thread per process (core/torch_thread.py): a torch backend loaded later keeps
    # one OpenMP team
    return on_torch_thread(_export, folder, key, inputs, head=head, cache_dir=cache_dir, opset=opset,
                           max_length=max_length, name=name or folder.name)


def cached_fp16(folder: Path, *, head: str, cache_dir: Path, max_length: int | None = None,
                name: str | None = None) -> Path:
    """The fp16 graph for ONNX Runtime's CUDA provider: the folder's own ``onnx/model_fp16.onnx``, else the
    cached fp32 export (``cached_or_export``) converted once (``core/convert/onnx_fp16.py``: fused, then
    fp16) into the same cache entry. Raises ``ExportUnavailable``."""
    folder = Path(folder)
    own = folder / "onnx" / "model_fp16.onnx"
    if own.exists():
        return own
    fp32 = cached_or_export(folder, head=head, cache_dir=cache_dir, max_length=max_length, name=name)
    fp16 = fp32.path.parent / "model_fp16.onnx"
    if fp16.exists():
        return fp16
    from core.convert.onnx_fp16 import convert_fp16

    fd, tmp = tempfile.mkstemp(dir=fp16.parent, prefix=".model_fp16.", suffix=".onnx")
    os.close(fd)
    try:
        config = json.loads((folder / "config.json").read_text())
        convert_fp16(fp32.path, Path(tmp), config=config)
        os.replace(tmp, fp16)
    except Exception as exc:  # noqa: BLE001 - any converter failure means "no ONNX Runtime CUDA candidate", and why
        raise ExportUnavailable(f"fp16 conversion failed: {type(exc).__name__}: {exc}") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)
    return fp16


def _export(folder: Path, key: str, inputs: dict, *, head: str, cache_dir: Path, opset: int,
            max_length: int | None, name: str) -> CachedGraph:
    from core.convert.onnx_export import export_model, load_head_model

    entry = entry_dir(cache_dir, key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{key}."))
    try:
        started = time.monotonic()
        log.info("%s: exporting the %s head to ONNX (first start for these weights; cache %s)", name,
                 head, entry)
        try:
            model = load_head_model(folder, head)
            # the reference first: tracing for the export may leave the module in a state unfit to run again
            feeds = probe_inputs(folder, head, max_length)
            want = torch_outputs(model, head, feeds)
            export_model(model, work / "model.onnx", head, opset=opset)
        except Exception as exc:  # noqa: BLE001 - any exporter failure means "serve with torch", and why
            reason = f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            _record_failure(entry, inputs, reason)
            raise ExportUnavailable(reason) from exc
        del model
        log.info("%s: exported in %.1fs; checking it against the torch forward on %d probe texts",
                 name, time.monotonic() - started, len(PROBE_TEXTS))
        cosines, norm_errors = compare(graph_outputs(work / "model.onnx", head, feeds), want, feeds["attention_mask"])
        bad = {k: v for k, v in cosines.items() if v < PARITY_MIN_COSINE or norm_errors[k] > PARITY_MAX_NORM_ERROR}
        if bad:
            reason = ("parity check failed: " + ", ".join(
                f"{k} worst cosine {cosines[k]:.6f} (norm error {norm_errors[k]:.2e})" for k in bad)
                + f"; needs cosine >= {PARITY_MIN_COSINE}")
            _record_failure(entry, inputs, reason)
            raise ExportUnavailable(reason)
        write_json(work / "entry.json", {**inputs, "key": key, "source": str(folder.resolve()),
                                          "min_cosine": cosines, "max_norm_error": norm_errors,
                                          "created": time.time()})
        try:
            os.rename(work, entry)
        except OSError:  # another process cached the same key meanwhile: use theirs
            if not (entry / "entry.json").exists():
                raise
        log.info("%s: ONNX graph checked (worst cosine %s) and cached in %.1fs", name,
                 ", ".join(f"{k} {v:.6f}" for k, v in cosines.items()), time.monotonic() - started)
        return CachedGraph(entry / "model.onnx", key, cosines, exported_now=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _record_failure(entry: Path, inputs: dict, reason: str) -> None:
    log.warning("%s", reason)
    try:
        write_json(entry / "failed.json", {**inputs, "reason": reason, "created": time.time()})
    except OSError as exc:
        log.debug("could not record the failure in %s: %s", entry, exc)


def probe_inputs(folder: Path, head: str, max_length: int | None = None) -> dict[str, np.ndarray]:
    """One padded batch of the probe texts, tokenized as the server tokenizes (pairs for a cross-encoder)."""
    from core.loading import read_model_info
    from core.tokenization import TextTokenizer, pad_batch

    info = read_model_info(folder, max_length=max_length)
    tok = TextTokenizer(folder, min(info.max_length, 128))
    if head == "sequence-classification":
        items = tok.encode_pairs([(PROBE_TEXTS[1], t) for t in PROBE_TEXTS])
    else:
        items = tok.encode(list(PROBE_TEXTS))
    return pad_batch(items, tok.pad_id)


def _row_cosines(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """Worst cosine and worst relative norm error between ``a`` (graph) and ``b`` (torch), per token
    vector for per-token outputs (padding left out), per row otherwise; a single-value row (one logit)
    is compared as the batch's column instead."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.ndim == 3:
        keep = mask.astype(bool)
        a, b = a[keep], b[keep]
    elif a.ndim == 1 or a.shape[-1] == 1:
        a, b = a.reshape(1, -1), b.reshape(1, -1)
    else:
        a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both_zero = (na == 0) & (nb == 0)
    cos = np.where(both_zero, 1.0, (a * b).sum(axis=1) / np.maximum(na * nb, 1e-30))
    norm_error = np.where(both_zero, 0.0, np.abs(na - nb) / np.maximum(nb, 1e-30))
    return float(cos.min()), float(norm_error.max())


def torch_outputs(model, head: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The head's outputs from the torch model (the reference)."""
    import torch

    from core.backends.heads import accepted_inputs, get_head

    spec = get_head(head)
    accepted = set(spec.inputs or accepted_inputs(model))
    with torch.inference_mode():
        out = spec.call(model, {k: torch.from_numpy(v) for k, v in feeds.items() if k in accepted})
    return {k: v.float().numpy() for k, v in out.items()}


def graph_outputs(graph: Path, head: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The head's outputs from the ONNX graph on ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    from core.backends.heads import get_head

    outputs = list(get_head(head).outputs)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return dict(zip(outputs, session.run(outputs, {k: v for k, v in feeds.items() if k in names})))


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], mask: np.ndarray
            ) -> tuple[dict[str, float], dict[str, float]]:
    """Per output: worst cosine and worst relative norm error of ``got`` against ``want``."""
    cosines, norm_errors = {}, {}
    for name in want:
        cosines[name], norm_errors[name] = _row_cosines(got[name], want[name], mask)
    return cosines, norm_errors
