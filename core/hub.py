"""Model sources: a spec's ``path`` is a local folder or a Hugging Face Hub id (``org/name``).

A Hub id is resolved through ``huggingface_hub`` into its cache (``HF_HOME`` / ``HF_HUB_CACHE``, with
``HF_TOKEN``, ``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` honoured as that library reads them), downloading only
the files the spec's backend reads (:func:`select_files`). The result is a plain local folder (the cached
snapshot of one commit) plus that commit's hash, which the model card reports as ``model_sha``.

``huggingface_hub`` is imported only when a Hub id is resolved: serving local folders never imports it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterable, Mapping

from core.errors import ModelUnavailable

if TYPE_CHECKING:
    from core.backends.base import BackendOptions
    from core.config import ModelSpec

log = logging.getLogger(__name__)

#: ``org/name`` as the Hub spells repository ids (huggingface_hub's own rules: at most 96 characters
#: each side, letters, digits, ``-``, ``_`` and ``.``; no ``--`` or ``..``)
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")

#: files every backend reads beside its weights: configs, tokenizers (vocab/merges, sentencepiece, tiktoken), chat
#: templates (vision–language embedders)
_META_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja")
#: sentence-transformers module folders (``1_Pooling``, ``2_Dense``, ``3_Normalize`` …)
_MODULE_DIR = re.compile(r"\d+_[^/]+")
#: a Stanford ColBERT checkpoint's settings, and its projection beside a converted encoder (every backend)
_STANFORD_COLBERT_FILES = ("artifact.metadata", "linear.safetensors")
#: weights of BGE-M3-style heads beside the encoder, which the task runs whatever the backend
#: (core/tasks/multi_output.py)
_HEAD_STEMS = ("sparse_linear", "colbert_linear")


def hub_id_of(path: str | Path) -> str | None:
    """The Hub id ``path`` names: ``org/name`` when no local file or folder of that name exists; else None."""
    text = PurePosixPath(path).as_posix() if isinstance(path, Path) else str(path)
    if not _HUB_ID.fullmatch(text) or "--" in text or ".." in text:
        return None
    return None if Path(text).exists() else text


@dataclass(frozen=True)
class ModelSource:
    """Where a spec's files are: ``spec`` is the spec to load (its ``path`` a local folder, its ``name`` the
    served name); ``repo_id`` and ``sha`` (the commit) are set for a Hub id."""

    spec: "ModelSpec"
    repo_id: str | None = None
    sha: str | None = None


def resolve_source(spec: "ModelSpec", *, download: bool = True) -> ModelSource:
    """A local folder as it is; a Hub id → its cached snapshot, fetched first when needed and allowed.

    Raises :class:`ModelUnavailable` with one line naming the model and what to do."""
    path = Path(spec.path)
    repo_id = hub_id_of(path)
    if repo_id is None:
        if spec.revision is not None:
            raise ModelUnavailable(f"model path {str(path)!r}: 'revision' applies to Hugging Face Hub ids "
                                   "(org/name) only, not to a local folder")
        if path.is_dir():
            return ModelSource(spec)
        if path.exists():
            raise ModelUnavailable(f"model path {str(path)!r} is a file, not a model folder")
        raise ModelUnavailable(f"model path {str(path)!r} does not exist: it is not a local folder, and not a "
                               "Hugging Face Hub id (org/name)")
    folder, sha = fetch(repo_id, revision=spec.revision, backend=spec.backend, dtype=spec.dtype,
                        options=spec.backend_options(), trust_remote_code=spec.trust_remote_code,
                        local_only=not download)
    # a file the options name inside the repository (onnx.file) is a file of the snapshot
    update: dict = {"path": folder, "name": spec.served_name,
                    **{name: options.in_folder(folder) for name, options in spec.backend_options().items()}}
    return ModelSource(spec.model_copy(update=update), repo_id=repo_id, sha=sha)


# --- which files a backend reads -------------------------------------------------------------------


def _module_files(files: Iterable[str]) -> list[str]:
    """What the sentence-transformers module folders hold: configs, and weights (safetensors over bin)."""
    by_dir: dict[str, list[str]] = {}
    for f in files:
        parts = f.split("/")
        if len(parts) == 2 and _MODULE_DIR.fullmatch(parts[0]):
            by_dir.setdefault(parts[0], []).append(f)
    picked: list[str] = []
    for members in by_dir.values():
        weights = [f for f in members if f.endswith(".safetensors")] or [f for f in members if f.endswith(".bin")]
        picked += [f for f in members if f.endswith(_META_SUFFIXES)] + weights
    return picked


def select_files(files: Iterable[str], *, backend: str = "auto", dtype: str = "float32",
                 options: "Mapping[str, BackendOptions] | None" = None, trust_remote_code: bool = False,
                 where: str = "the model") -> list[str]:
    """The files of a repository (``files``: its paths) that ``backend`` reads, or ``ModelUnavailable``
    naming what the repository lacks: the configs and tokenizers every backend reads, plus what the backend
    declares (``Backend.files``, given the spec's ``options`` by backend name). ``auto`` takes what every
    backend declares (the torch weights and, where the repository has them, the ONNX graph for ``dtype``,
    ``ct2/``, ``neuron/``): the folder then chooses as a local one would (docs/models.md).

    The catalog is asked here, not at import: the backends' package reads model folders (``core.loading``)
    at import, so model sources reach the backends' declarations only when they select files."""
    from core.backends.catalog import backend_class, backend_classes, names

    choices = ("auto", *names())
    if backend not in choices:
        raise ModelUnavailable(f"unknown backend {backend!r}; known: {list(choices)}")
    files = set(files)
    root = sorted(f for f in files if "/" not in f)
    picked = ({f for f in root if f.endswith(_META_SUFFIXES) or f in _STANFORD_COLBERT_FILES}
              | {f for f in root if PurePosixPath(f).stem in _HEAD_STEMS and f.endswith((".pt", ".safetensors"))}
              | set(_module_files(files)))
    if trust_remote_code:
        picked |= {f for f in root if f.endswith(".py")}
    options = options or {}
    weights: set[str] = set()
    for cls in backend_classes() if backend == "auto" else [backend_class(backend)]:
        found = cls.files(files, dtype=dtype, options=options.get(cls.name))
        if backend == cls.name and not found:
            raise ModelUnavailable(cls.missing_files(where, dtype=dtype, options=options.get(cls.name)))
        weights |= set(found)
    if not weights:
        raise ModelUnavailable(f"{where} has no model weights (model.safetensors, pytorch_model.bin or an "
                               "ONNX graph)")
    return sorted(picked | weights)


def _patterns(files: list[str]) -> list[str]:
    """Exact paths as ``allow_patterns`` (fnmatch): escape the characters fnmatch treats specially."""
    return [re.sub(r"([\[\]*?])", r"[\1]", f) for f in files]


# --- fetching --------------------------------------------------------------------------------------


def _fetch_command(repo_id: str, revision: str | None, backend: str) -> str:
    cmd = f"python -m core download {repo_id}"
    if revision:
        cmd += f" --revision {revision}"
    if backend != "auto":
        cmd += f" --backend {backend}"
    return cmd


def fetch(repo_id: str, *, revision: str | None = None, backend: str = "auto", dtype: str = "float32",
          options: "Mapping[str, BackendOptions] | None" = None, trust_remote_code: bool = False,
          local_only: bool = False) -> tuple[Path, str]:
    """The local snapshot folder of ``repo_id`` at ``revision`` holding what ``backend`` reads, and its
    commit hash. Online, missing files are downloaded (huggingface_hub's progress bars show on long
    downloads); offline (``HF_HUB_OFFLINE=1`` or ``local_only``) or with the Hub unreachable, the cache
    alone answers. Works with huggingface_hub 0.35 to 2.x (the images pin different ones)."""
    from core.errors import require

    huggingface_hub = require("huggingface_hub", "hub")
    from huggingface_hub import constants, errors

    rev = revision or constants.DEFAULT_REVISION
    what = f"model {repo_id!r}" + (f" (revision {revision!r})" if revision else "")
    howto = _fetch_command(repo_id, revision, backend)
    kwargs = dict(backend=backend, dtype=dtype, options=options, trust_remote_code=trust_remote_code)
    unreachable: Exception | None = None
    if not (local_only or _offline(constants)):
        api = huggingface_hub.HfApi()
        try:
            # one commit for the listing and the download (newer huggingface_hub: ResolvedRevision, which
            # also records refs/<rev>; older: snapshot_download records it and resolves again)
            pinned = api.resolve_revision(repo_id, revision=rev) if hasattr(api, "resolve_revision") else rev
            info = api.model_info(repo_id, revision=getattr(pinned, "resolved", pinned))
            wanted = select_files([s.rfilename for s in info.siblings or ()], where=f"{what} on the Hub", **kwargs)
            log.info("fetching %s at %s: %d files", repo_id, (info.sha or rev)[:12], len(wanted))
            folder = huggingface_hub.snapshot_download(repo_id, revision=pinned, allow_patterns=_patterns(wanted))
            return Path(folder), Path(folder).name
        except errors.GatedRepoError as exc:
            raise ModelUnavailable(f"{what} is gated on {constants.ENDPOINT}: accept its terms there and set "
                                   f"HF_TOKEN ({_reason(exc)})") from None
        except errors.RepositoryNotFoundError as exc:
            raise ModelUnavailable(f"{what}: no such repository on {constants.ENDPOINT}, or it is private (set "
                                   f"HF_TOKEN); no local folder of that name exists either ({_reason(exc)})") from None
        except errors.RevisionNotFoundError:
            raise ModelUnavailable(f"{what}: revision {rev!r} not found on {constants.ENDPOINT}") from None
        except errors.LocalEntryNotFoundError as exc:  # (a subclass of EntryNotFoundError) the Hub went away
            unreachable = exc
        except errors.EntryNotFoundError as exc:  # a listed file the Hub answers 404 for
            raise ModelUnavailable(f"{what}: {_missing_file(exc)}, which the Hub lists, could not be downloaded "
                                   f"({_reason(exc)})") from None
        except (getattr(errors, "RevisionResolutionError", OSError), OSError) as exc:
            unreachable = exc  # the Hub is down or unreachable: the cache may still hold the files
        except Exception as exc:  # httpx / requests connection errors and timeouts
            if type(exc).__module__.split(".")[0] not in ("httpx", "httpx2", "httpcore", "requests", "urllib3"):
                raise
            unreachable = exc
    return _from_cache(repo_id, rev, what, howto, unreachable, kwargs)


def _offline(constants) -> bool:
    is_offline = getattr(constants, "is_offline_mode", None)
    return bool(is_offline() if callable(is_offline) else constants.HF_HUB_OFFLINE)


def _from_cache(repo_id: str, rev: str, what: str, howto: str, unreachable: Exception | None,
                kwargs: dict) -> tuple[Path, str]:
    import huggingface_hub
    from huggingface_hub import constants, errors

    why = (f"{constants.ENDPOINT} could not be reached ({_reason(unreachable)})" if unreachable is not None
           else "HF_HUB_OFFLINE is set")
    listing = None
    cached_tree = getattr(huggingface_hub, "get_cached_repo_tree", None)  # huggingface_hub >= 2
    if cached_tree is not None:
        try:  # the listing snapshot_download cached: the check below then uses the repository's own names
            listing = [f.path for f in cached_tree(repo_id, revision=rev)]
        except Exception:  # CachedRepoTreeNotFoundError: a cache written without it
            listing = None
    patterns = _patterns(select_files(listing, where=what, **kwargs)) if listing else None
    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    try:
        folder = Path(huggingface_hub.snapshot_download(repo_id, revision=rev, local_files_only=True,
                                                        allow_patterns=patterns))
    except incomplete:
        raise ModelUnavailable(f"{what}: the cached snapshot lacks files the {kwargs['backend']} backend reads "
                               f"and {why}; fetch them with `{howto}`") from None
    except (errors.LocalEntryNotFoundError, OSError):
        raise ModelUnavailable(f"{what} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; "
                               f"fetch it first with `{howto}` (no local folder of that name exists either)") from None
    present = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    try:
        select_files(present, where=f"{what}: the cached snapshot {folder}", **kwargs)
    except ModelUnavailable as exc:
        raise ModelUnavailable(f"{exc.message}; fetch it with `{howto}`") from None
    return folder, folder.name


def _missing_file(exc: BaseException) -> str:
    """The repository path of the file a 404 answered (from the ``…/resolve/<revision>/<path>`` URL)."""
    from urllib.parse import unquote

    response = getattr(exc, "response", None)
    url = unquote(str(getattr(response, "url", "") or ""))
    _, sep, tail = url.partition("/resolve/")
    return repr(tail.split("/", 1)[1]) if sep and "/" in tail else "a file"


def _reason(exc: BaseException | None) -> str:
    """The first line of a huggingface_hub error (they carry several lines of advice)."""
    text = str(exc or "").strip().splitlines()
    return text[0] if text else type(exc).__name__
