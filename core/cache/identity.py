"""A served model's identity for the embedding cache: what makes two models give the same vector.

The identity hashes the bytes actually served (every file of the model folder, and the graph the backend
runs when it lives elsewhere, e.g. in the export cache), the backend, the dtype, the device kind, the spec's
options that change a vector (pooling, prompts, max length, chunking default, the served backend's options
``SPEC_FIELDS`` and ``BACKEND_OPTION_FIELDS`` mark) and the effective max length. Two served names over the
same folder and options share their identity; a changed weight, tokenizer, pooling file, revision, backend,
backend option or dtype never does."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

#: bumped when the cached value's meaning changes (pooling code, value layout): it is in every key (and the
#: Redis key prefix) and in every value's header, so old entries are never read
KEY_VERSION = 2

#: the identity holds it (as the part of that name, or the effective value the engine serves with)
IN_IDENTITY = "identity"
#: the bytes it selects are hashed (the folder's files; a Hub revision is its snapshot's files)
FILES = "files hashed"
#: it never changes a vector (names, batching, queueing, threads, a gate)
NO_VECTOR = "does not change the vector"
#: applied after the cache (quantization of the cached floats)
AFTER = "applied after the cache"

#: every field of ``ModelSpec`` → its decision (tests/cache enumerates the model's fields)
SPEC_FIELDS: dict[str, str] = {
    "path": FILES, "revision": FILES, "name": NO_VECTOR, "task": IN_IDENTITY, "backend": IN_IDENTITY,
    "device": IN_IDENTITY, "dtype": IN_IDENTITY, "max_batch_tokens": NO_VECTOR, "max_batch_size": NO_VECTOR,
    "max_queue_items": NO_VECTOR, "inline_batch_ms": NO_VECTOR, "max_length": IN_IDENTITY, "threads": NO_VECTOR,
    "pad_to_multiple_of": NO_VECTOR, "prompts": IN_IDENTITY, "default_prompt_name": IN_IDENTITY,
    "pooling": IN_IDENTITY, "dense_path": IN_IDENTITY, "trust_remote_code": NO_VECTOR,
    "embedding_dtype": AFTER, "chunking": IN_IDENTITY,
    # each backend's options: their fields are decided in BACKEND_OPTION_FIELDS
    "torch": IN_IDENTITY, "onnx": IN_IDENTITY,
}

#: every backend option (``backend.field``) → its decision; the served backend's IN_IDENTITY options are hashed
BACKEND_OPTION_FIELDS: dict[str, str] = {
    "torch.compile": IN_IDENTITY,  # compiled kernels may round differently
    "onnx.file": IN_IDENTITY,  # the graph served (its bytes are hashed too: ``served_file``)
    "onnx.workers": NO_VECTOR, "onnx.spin": NO_VECTOR,
    "onnx.optimized": IN_IDENTITY, "onnx.providers": IN_IDENTITY,
}

_CHUNK = 1 << 20

#: (resolved path, size, mtime_ns) → content hash, for this process (a folder is read once)
_file_hashes: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def file_hash(path: Path) -> str:
    resolved = path.resolve()
    stat = resolved.stat()
    memo = (str(resolved), stat.st_size, stat.st_mtime_ns)
    with _lock:
        known = _file_hashes.get(memo)
    if known is not None:
        return known
    digest = hashlib.blake2b(digest_size=32)
    with open(resolved, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    value = digest.hexdigest()
    with _lock:
        _file_hashes[memo] = value
    return value


def folder_files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (links followed, as a Hugging Face snapshot's are), in a stable order;
    dot-folders (``.git``, ``.cache``) left out."""
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_file():
            files.append(path)
    return files


def backend_options(spec: Any, backend: str) -> dict[str, Any]:
    """The served backend's options that change a vector (an option without a decision counts as one)."""
    options = getattr(spec, backend, None)
    if options is None:
        return {}
    values = options.model_dump(mode="json")
    return {name: value for name, value in sorted(values.items())
            if BACKEND_OPTION_FIELDS.get(f"{backend}.{name}", IN_IDENTITY) == IN_IDENTITY}


def model_identity(engine: Any) -> str:
    """The hex identity of ``engine``'s served model (reads its files once per process: call off the loop)."""
    text = json.dumps(identity_parts(engine), sort_keys=True, default=str).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


def identity_parts(engine: Any) -> dict[str, Any]:
    """What ``model_identity`` hashes: the served model's options and the hashes of its files."""
    spec = engine.spec
    folder = Path(spec.path)
    parts: dict[str, Any] = {
        "version": KEY_VERSION,
        "task": engine.task.name,
        "backend": engine.backend.name,
        "dtype": spec.dtype,
        "device": str(spec.device).split(":")[0],
        "max_length": getattr(engine.task.info, "max_length", None),
        "pooling": spec.pooling,
        "dense_path": spec.dense_path,
        "prompts": dict(sorted(spec.prompts.items())),
        "default_prompt_name": spec.default_prompt_name,
        "chunking": spec.chunking.model_dump() if spec.chunking is not None else None,
        "backend_options": backend_options(spec, engine.backend.name),
    }
    files = {}
    if folder.is_dir():
        for path in folder_files(folder):
            files[str(path.relative_to(folder))] = file_hash(path)
    served = getattr(engine.backend, "served_file", None)
    if served is not None and Path(served).is_file():
        parts["served_file"] = file_hash(Path(served))
    parts["files"] = files
    return parts
