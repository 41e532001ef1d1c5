"""A served model's identity for the embedding cache: what makes two models give the same vector.

The identity hashes the bytes actually served (every file of the model folder, and the graph the backend
runs when it lives elsewhere, e.g. in the export cache), the backend, the dtype, the device kind, the spec's
options that change a vector (pooling, prompts, max length, chunking default) and the effective max length.
Two served names over the same folder and options share their identity; a changed weight, tokenizer,
pooling file, backend or dtype never does."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

#: bumped when the cached value's meaning changes (pooling code, value layout): old entries are never read
KEY_VERSION = 1

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


def model_identity(engine: Any) -> str:
    """The hex identity of ``engine``'s served model (reads its files once per process: call off the loop)."""
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
    }
    files = {}
    if folder.is_dir():
        for path in folder_files(folder):
            files[str(path.relative_to(folder))] = file_hash(path)
    served = getattr(engine.backend, "served_file", None)
    if served is not None and Path(served).is_file():
        parts["served_file"] = file_hash(Path(served))
    parts["files"] = files
    text = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()
