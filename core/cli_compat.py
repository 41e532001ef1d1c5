"""Infinity's and TEI's command lines over Tessera's settings: ``tessera v2 --model-id X --batch-size 8``
(``infinity_emb v2``) and ``tessera --model-id X --port 8080`` (``text-embeddings-router``) serve what the
other program would, read into the same ``Settings`` as ``--model path=…,dtype=…``.

Per-model flags repeat as Infinity's do: the n-th value belongs to the n-th ``--model-id``, and a single
value applies to every one (any other count is an error). Infinity's ``INFINITY_*`` variables stand for
their flags (``;`` between per-model values) when the flag itself is not given. TEI's own variables are
unprefixed (``MODEL_ID``, ``PORT``, ``HOSTNAME``): a shell or a container sets some of them for other
reasons (``HOSTNAME`` always), so they are not read; give TEI's flags instead.
"""

from __future__ import annotations

import argparse
import difflib
import json
from dataclasses import dataclass, field
from typing import Callable, Mapping

from core.errors import ConfigError

#: Infinity's first argument: its command (``infinity_emb v2 ...``); Tessera's is ``serve``
COMMAND_ALIASES = {"v1": "serve", "v2": "serve"}

ENGINES = {"torch": "torch", "optimum": "onnx", "ctranslate2": "ct2", "neuron": "neuron"}
DEVICES = {"cpu": "cpu", "cuda": "cuda", "auto": "auto", "neuron": "neuron"}
DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int8": "int8", "auto": None}
EMBEDDING_DTYPES = {"float32": "float", "float": "float", "int8": "int8", "uint8": "uint8", "binary": "binary",
                    "ubinary": "ubinary"}
POOLINGS = {"mean": "mean", "cls": "cls", "max": "max", "last-token": "lasttoken", "lasttoken": "lasttoken",
            "auto": None}
TRUE = {"true", "t", "1", "yes", "y"}
FALSE = {"false", "f", "0", "no", "n"}


def _choice(flag: str, table: Mapping[str, str | None]) -> Callable[[str], str | None]:
    def convert(value: str) -> str | None:
        key = value.strip().lower()
        if key not in table:
            known = " | ".join(table)
            raise ConfigError([f"{flag} {value!r}: not offered here; one of {known}"])
        return table[key]
    return convert


def _int(flag: str) -> Callable[[str], int]:
    def convert(value: str) -> int:
        try:
            return int(value)
        except ValueError:
            raise ConfigError([f"{flag} {value!r}: expected a whole number"]) from None
    return convert


def _bool(flag: str) -> Callable[[str], bool]:
    def convert(value: str) -> bool:
        text = value.strip().lower()
        if text in TRUE or text in FALSE:
            return text in TRUE
        raise ConfigError([f"{flag} {value!r}: expected true or false"])
    return convert


def _text(value: str) -> str:
    return value


@dataclass(frozen=True)
class PerModel:
    """A flag whose values go to the ``--model-id``s: the ``ModelSpec`` field it sets and how a value reads."""
    flag: str
    field: str
    convert: Callable[[str], object]
    boolean: bool = False  # --flag / --no-flag


PER_MODEL = [
    PerModel("--served-model-name", "name", _text),
    PerModel("--batch-size", "max_batch_size", _int("--batch-size")),
    PerModel("--max-batch-requests", "max_batch_size", _int("--max-batch-requests")),
    PerModel("--max-batch-tokens", "max_batch_tokens", _int("--max-batch-tokens")),
    PerModel("--revision", "revision", _text),
    PerModel("--engine", "backend", _choice("--engine", ENGINES)),
    PerModel("--device", "device", _choice("--device", DEVICES)),
    PerModel("--dtype", "dtype", _choice("--dtype", DTYPES)),
    PerModel("--embedding-dtype", "embedding_dtype", _choice("--embedding-dtype", EMBEDDING_DTYPES)),
    PerModel("--pooling-method", "pooling", _choice("--pooling-method", POOLINGS)),
    PerModel("--pooling", "pooling", _choice("--pooling", {**POOLINGS, "splade": "splade"})),
    PerModel("--dense-path", "dense_path", _text),
    PerModel("--default-prompt-name", "default_prompt_name", _text),
    PerModel("--default-prompt", "prompt", _text),
    PerModel("--trust-remote-code", "trust_remote_code", _bool("--trust-remote-code"), boolean=True),
    PerModel("--compile", "compile", _bool("--compile"), boolean=True),
]


@dataclass(frozen=True)
class Global:
    """A server-wide flag: the ``Settings`` field it sets (or an environment variable the process hands on)."""
    flag: str
    field: str | None
    convert: Callable[[str], object] = _text
    boolean: bool = False
    env: str | None = None  # set in the process's environment instead (read by the library that uses it)


GLOBAL = [
    Global("--hostname", "host"),
    Global("--max-client-batch-size", "max_items_per_request", _int("--max-client-batch-size")),
    Global("--max-concurrent-requests", "max_inflight_requests", _int("--max-concurrent-requests")),
    Global("--payload-limit", "max_request_bytes", _int("--payload-limit")),
    Global("--tokenization-workers", "tokenization_workers", _int("--tokenization-workers")),
    Global("--proxy-root-path", "root_path"),
    Global("--cors-allow-origin", "cors_origins"),
    Global("--permissive-cors", "cors_origins", _bool("--permissive-cors"), boolean=True),
    Global("--json-output", "log_format", _bool("--json-output"), boolean=True),
    Global("--auto-truncate", None, _bool("--auto-truncate"), boolean=True),
    Global("--preload-only", None, _bool("--preload-only"), boolean=True),
    Global("--hf-token", None, env="HF_TOKEN"),
    Global("--hf-api-token", None, env="HF_TOKEN"),
    Global("--huggingface-hub-cache", None, env="HF_HUB_CACHE"),
    Global("--otlp-endpoint", None, env="OTEL_EXPORTER_OTLP_ENDPOINT"),
    Global("--otlp-service-name", None, env="OTEL_SERVICE_NAME"),
]

#: flags of the other programs that change nothing here (the behaviour is Tessera's own, or fixed): accepted,
#: with a note on stderr; ``True``: the flag takes a value
IGNORED = {
    "--model-warmup": False, "--vector-disk-cache": False, "--lengths-via-tokenize": False,
    "--bettertransformer": False, "--onnx-disable-optimize": False, "--onnx-do-not-prefer-quantized": False,
    "--device-id": True, "--redirect-slash": True, "--uds-path": True,
    "--prometheus-port": True, "--disable-spans": False,
}

#: Infinity's variables: INFINITY_<FLAG> for each of its flags (``;`` between per-model values)
INFINITY_FLAGS = ("--model-id", "--served-model-name", "--batch-size", "--revision", "--trust-remote-code",
                  "--engine", "--device", "--dtype", "--embedding-dtype", "--pooling-method", "--compile",
                  "--host", "--port", "--url-prefix", "--api-key", "--log-level", "--permissive-cors",
                  "--proxy-root-path", "--preload-only", "--model-warmup", "--vector-disk-cache",
                  "--lengths-via-tokenize", "--bettertransformer", "--device-id", "--redirect-slash",
                  "--onnx-disable-optimize", "--onnx-do-not-prefer-quantized")

#: Infinity's flags that are Tessera's own options too (same meaning): left to Tessera's parser
TESSERA_OWN = frozenset({"--host", "--port", "--url-prefix", "--api-key", "--log-level"})

ONE_LINE_HINT = ("one model with its options in one line: --model path=PATH,name=NAME,dtype=int8,backend=onnx "
                 "(`python -m core serve --help` lists every option)")


def _dest(flag: str) -> str:
    return "compat_" + flag.lstrip("-").replace("-", "_")


def compat_flags() -> list[str]:
    """Every flag this module reads (for did-you-mean)."""
    flags = ["--model-id", *(p.flag for p in PER_MODEL), *(g.flag for g in GLOBAL), *IGNORED]
    flags += [f"--no-{p.flag[2:]}" for p in PER_MODEL if p.boolean]
    return flags


def normalise_command(argv: list[str]) -> list[str]:
    """``v2 ARGS`` (Infinity) and bare ``--flags`` (TEI: ``text-embeddings-router --model-id X``) are ``serve``."""
    if argv and argv[0] in COMMAND_ALIASES:
        return [COMMAND_ALIASES[argv[0]], *argv[1:]]
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        return ["serve", *argv]
    return argv


@dataclass
class Compat:
    """What the Infinity/TEI flags asked for."""
    models: list[dict] = field(default_factory=list)  # from --model-id (Infinity's broadcast applied)
    per_model: dict[str, list] = field(default_factory=dict)  # field → values (applied to --model specs too)
    settings: dict[str, object] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    preload_only: bool = False

    def apply(self, specs: list[dict]) -> list[dict]:
        """The model specs to serve: ``specs`` (from ``--model``) with the per-model values as defaults
        (one value each, as ``--backend``), then the ``--model-id`` models."""
        for field_name, values in self.per_model.items():
            if specs and len(values) > 1:
                raise ConfigError([f"{_flag_of(field_name)} given {len(values)} times: with --model, give it once "
                                   "(or put it in each --model spec)"])
        for spec in specs:
            for field_name, values in self.per_model.items():
                _set(spec, field_name, values[0], keep=True)
        return [*specs, *self.models]


def _flag_of(field_name: str) -> str:
    return next(p.flag for p in PER_MODEL if p.field == field_name)


def _set(spec: dict, field_name: str, value, *, keep: bool = False) -> None:
    if value is None:  # 'auto': the default
        return
    if field_name == "prompt":  # TEI's --default-prompt: the prompt used when a request names none
        spec.setdefault("prompts", {}).setdefault("default", value)
        spec.setdefault("default_prompt_name", "default")
        return
    if field_name == "pooling" and value == "splade":  # TEI's --pooling splade: the sparse task
        spec.setdefault("task", "sparse")
        return
    if keep:
        spec.setdefault(field_name, value)
    else:
        spec[field_name] = value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model-id", dest=_dest("--model-id"), action="append")
    for item in PER_MODEL:
        if item.boolean:
            parser.add_argument(item.flag, dest=_dest(item.flag), action="append_const", const="true")
            parser.add_argument("--no-" + item.flag[2:], dest=_dest(item.flag), action="append_const", const="false")
        else:
            parser.add_argument(item.flag, dest=_dest(item.flag), action="append")
    for item in GLOBAL:
        if item.boolean:  # --flag, --flag VALUE (TEI's --auto-truncate false), --no-flag
            parser.add_argument(item.flag, dest=_dest(item.flag), nargs="?", const="true")
            parser.add_argument("--no-" + item.flag[2:], dest=_dest(item.flag), action="store_const", const="false")
        else:
            parser.add_argument(item.flag, dest=_dest(item.flag), action="append")
    for flag, takes_value in IGNORED.items():
        if takes_value:
            parser.add_argument(flag, dest=_dest(flag), action="append")
        else:
            parser.add_argument(flag, dest=_dest(flag), nargs="?", const="true")
            parser.add_argument("--no-" + flag[2:], dest=_dest(flag), action="store_const", const="false")
    return parser


def infinity_env_args(environ: Mapping[str, str], given: list[str]) -> tuple[list[str], list[str]]:
    """``INFINITY_*`` variables as flags (those whose flag is not on the command line), and notes on the
    ``INFINITY_*`` variables that name no flag."""
    args: list[str] = []
    notes: list[str] = []
    flags = {"INFINITY_" + f[2:].upper().replace("-", "_"): f for f in INFINITY_FLAGS}
    booleans = {f for f in INFINITY_FLAGS if _is_bool_flag(f)}
    for name, text in sorted(environ.items()):
        if not name.startswith("INFINITY_"):
            continue
        flag = flags.get(name)
        if flag is None:
            close = difflib.get_close_matches(name, list(flags), n=1)
            notes.append(f"{name} is not one of Infinity's variables read here, ignored"
                         + (f" (did you mean {close[0]}?)" if close else ""))
            continue
        if flag in given or f"--no-{flag[2:]}" in given:
            continue
        values = text.removesuffix(";").split(";") if text.strip() else []
        for value in values:
            if flag in booleans:  # INFINITY_TRUST_REMOTE_CODE="true;false": --trust-remote-code --no-trust-...
                args.append(("--" if value.strip().lower() in TRUE else "--no-") + flag[2:])
            else:
                args += [flag, value]
    return args, notes


def parse(argv: list[str], environ: Mapping[str, str]) -> tuple[Compat, list[str]]:
    """Take the Infinity/TEI flags out of ``serve``'s arguments (and ``INFINITY_*`` from ``environ``):
    what they ask for, and the arguments left for Tessera's own parser."""
    given = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
    env_args, notes = infinity_env_args(environ, given)
    # Tessera's own options among INFINITY_* (host, port, url-prefix, api-key, log-level) go to its parser
    env_ours: list[str] = []
    env_compat: list[str] = []
    i = 0
    while i < len(env_args):
        flag = env_args[i]
        takes_value = not (flag.startswith("--no-") or _is_bool_flag(flag))
        chunk = env_args[i:i + (2 if takes_value else 1)]
        (env_ours if flag in TESSERA_OWN else env_compat).extend(chunk)
        i += len(chunk)
    namespace, rest = _parser().parse_known_args(env_compat + argv)
    values = vars(namespace)
    compat = Compat(notes=notes)

    for flag in IGNORED:
        if values[_dest(flag)] is not None:
            compat.notes.append(f"{flag} changes nothing here (accepted for compatibility)")

    model_ids = values[_dest("--model-id")] or []
    for item in PER_MODEL:
        raw = values[_dest(item.flag)]
        if not raw:
            continue
        converted = [item.convert(v) for v in raw]
        if model_ids and len(converted) not in (1, len(model_ids)):
            raise ConfigError([f"{item.flag} given {len(converted)} times for {len(model_ids)} --model-id: give it "
                               "once (for every model) or once per --model-id, in the same order"])
        compat.per_model[item.field] = converted  # a later flag of the same field wins (e.g. --pooling)
    for n, model_id in enumerate(model_ids):
        spec: dict = {"path": model_id}
        for field_name, vals in compat.per_model.items():
            _set(spec, field_name, vals[n] if len(vals) > 1 else vals[0])
        if spec.get("name") == "":  # Infinity's default served name: the model id
            del spec["name"]
        compat.models.append(spec)
    if model_ids:
        compat.per_model = {}  # applied to the --model-id models

    for item in GLOBAL:
        raw = values[_dest(item.flag)]
        if raw is None or raw == []:
            continue
        value = item.convert(raw) if isinstance(raw, str) else [item.convert(v) for v in raw]
        if item.env is not None:
            compat.environ[item.env] = value[-1] if isinstance(value, list) else value
        elif item.flag == "--auto-truncate":
            if not value:
                raise ConfigError(["--auto-truncate false: not offered as a server setting: every route truncates "
                                   "to the model's max length unless the request sends truncate: false"])
        elif item.flag == "--preload-only":
            compat.preload_only = bool(value)
        elif item.flag == "--permissive-cors":
            if value:
                compat.settings["cors_origins"] = ["*"]
        elif item.flag == "--json-output":
            if value:
                compat.settings["log_format"] = "json"
        elif item.flag == "--cors-allow-origin":
            compat.settings["cors_origins"] = [o.strip() for v in value for o in v.split(",") if o.strip()]
        else:
            compat.settings[item.field] = value[-1] if isinstance(value, list) else value
    return compat, env_ours + rest


def _is_bool_flag(flag: str) -> bool:
    booleans = {p.flag for p in PER_MODEL if p.boolean} | {g.flag for g in GLOBAL if g.boolean} | {
        f for f, takes in IGNORED.items() if not takes}
    return flag in booleans


def unknown_options(extras: list[str], known: list[str]) -> str:
    """The error for arguments no parser took: each unknown flag with its nearest known one, and the
    one-line ``--model`` form."""
    lines = []
    after_flag = False
    for arg in extras:
        if not arg.startswith("-"):
            if not after_flag:  # (a value right after an unknown flag is that flag's)
                lines.append(f"unexpected argument {arg!r}")
            after_flag = False
            continue
        after_flag = "=" not in arg
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        lines.append(f"unknown option {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
    return "; ".join(lines) + f". For {ONE_LINE_HINT}"


def api_key_values(values: list[str]) -> list[str]:
    """``--api-key`` values: each a key, or a JSON list of keys (``--api-key '["a","b"]'``)."""
    keys: list[str] = []
    for value in values:
        text = value.strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError([f"--api-key: a value starting with '[' must be a JSON list of keys ({exc.msg})"]
                                  ) from None
            if not isinstance(parsed, list) or not all(isinstance(k, str) for k in parsed):
                raise ConfigError(["--api-key: a JSON value must be a list of strings"])
            keys += parsed
        else:
            keys.append(value)
    return keys
