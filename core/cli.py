"""``python -m core serve [--model PATH[:NAME]]... [--port N] ...`` over the same Settings, and
``python -m core download [MODEL...] [--revision R] [--backend B]`` (Hub models into the Hugging Face cache).

Every Settings field becomes an option of ``serve`` (``--max-request-bytes``), each listing its ``TESSERA_``
variable; options given on the command line win over the environment.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import re
import sys

from core import cli_compat
from core.backends.catalog import names as backend_names
from core.config import BACKEND_OPTIONS, ModelSpec, Settings, settings_from_env, spec_keys
from core.errors import ConfigError, StartupFailed, TesseraError

_SKIP = {"models"}  # given as --model (or TESSERA_MODELS / a config file for full specs)


def _parse_model(value: str) -> dict:
    """``PATH[:NAME]``, a one-line spec ``path=PATH,name=NAME,backend=onnx,...`` (see
    :func:`parse_model_spec`), or a JSON object."""
    if value.lstrip().startswith("{"):
        import json

        try:
            spec = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError([f"--model {value!r}: not a valid JSON object ({exc})"]) from None
        if not isinstance(spec, dict):
            raise ConfigError([f"--model {value!r}: expected a JSON object"])
        return spec
    if _SPEC_KEY.match(value):
        return parse_model_spec(value)
    path, sep, name = value.rpartition(":")
    if not sep or not path or "/" in name:  # no NAME part (or a ':' inside the path)
        path, name = value, ""
    spec = {"path": path}
    if name:
        spec["name"] = name
    return spec


#: a spec begins with ``key=`` (a key of ModelSpec, ``prompt`` or ``prompt.NAME``, a backend's ``onnx.workers``)
_SPEC_KEY = re.compile(r"^\s*(" + "|".join(spec_keys()) + r"|(?:prompt|chunking|" + "|".join(BACKEND_OPTIONS)
                       + r")(\.[^=,]+)?)\s*=")
#: list fields, given with ';' between items (providers=CUDAExecutionProvider;CPUExecutionProvider)
_LIST_FIELDS = {"providers", "onnx.providers"}


def _list(text: str) -> list[str]:
    return [part.strip() for part in text.split(";") if part.strip()]


def parse_model_spec(value: str) -> dict:
    """``path=/models/e5,name=e5,backend=onnx,dtype=int8,prompt=query: `` → a ModelSpec's fields.

    Items are ``key=value`` separated by commas; an item holding a comma is quoted as a whole
    (``"prompt=query, then: "``). ``prompt=TEXT`` sets the prompt used when a request names none
    (``prompts.default`` and ``default_prompt_name``); ``prompt.NAME=TEXT`` adds a named prompt;
    ``chunking.size=N,chunking.overlap=K`` sets the chunking default; ``onnx.workers=2`` a backend's own option
    (as does its flat key, ``workers=2``); list fields take ``;``-separated items. Types and unknown keys are checked with the other settings."""
    spec: dict = {}
    for item in next(csv.reader([value], skipinitialspace=True)):
        if not item.strip():
            continue
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError([f"--model {value!r}: {item!r} is not key=value"])
        if key == "prompt":
            spec.setdefault("prompts", {})["default"] = text
            spec.setdefault("default_prompt_name", "default")
        elif key.startswith("prompt."):
            spec.setdefault("prompts", {})[key[len("prompt."):]] = text
        elif key.startswith("chunking."):  # chunking.size=512,chunking.overlap=64: the model's chunking default
            spec.setdefault("chunking", {})[key[len("chunking."):]] = text
        elif key.partition(".")[0] in BACKEND_OPTIONS and "." in key:  # onnx.workers=2: a backend's own option
            backend, _, option = key.partition(".")
            spec.setdefault(backend, {})[option] = (_list(text) if f"{backend}.{option}" in _LIST_FIELDS else text)
        elif key in _LIST_FIELDS:
            spec[key] = _list(text)
        elif key in spec:
            raise ConfigError([f"--model {value!r}: {key!r} given twice"])
        else:
            spec[key] = text
    if "path" not in spec:
        raise ConfigError([f"--model {value!r}: a spec needs path=..."])
    return spec


def _default_text(field) -> str:
    """The default as a user would type it (the option's own default is None, so the environment wins)."""
    value = field.get_default(call_default_factory=True)
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value} on this machine" if field.default_factory is not None else str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m core", description="Tessera: serve embedding models")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve models over HTTP (uvicorn)", epilog=_COMPAT_EPILOG)
    serve.add_argument("--model", action="append", default=[], metavar="PATH[:NAME] | path=PATH,KEY=VALUE,...",
                       help="a model folder or Hugging Face Hub id (org/name) to serve, optionally with its "
                            "served name, or a spec in one line (e.g. path=/m/e5,name=e5,backend=onnx,dtype=int8,"
                            "prompt='query: '; prompt.NAME=TEXT adds a named prompt) or a JSON object (repeatable); "
                            "env TESSERA_MODELS (JSON list). Fields: " + ", ".join(spec_keys()))
    serve.add_argument("--backend", default=None,
                       help="backend for every --model: " + " | ".join(["auto", *backend_names()]) + " (default auto)")
    serve.add_argument("--revision", default=None,
                       help="Hub branch, tag or commit for every --model (each must then be a Hub id)")
    for name, field in Settings.model_fields.items():
        if name in _SKIP:
            continue
        env = f"TESSERA_{name.upper()}"
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description or name} (env {env}; default {_default_text(field)})".replace("%", "%%")
        if field.annotation is bool:
            serve.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif name == "api_keys":
            serve.add_argument("--api-key", dest="api_keys", action="append", default=None, help=help_text)
        else:
            serve.add_argument(flag, dest=name, default=None, help=help_text)
    download = sub.add_parser(
        "download", help="fetch Hugging Face Hub models into the Hugging Face cache (HF_HOME), for serving offline",
        description="Fetch each MODEL (a Hub id org/name) into the Hugging Face cache, only the files BACKEND "
                    "reads; without MODEL, the Hub models of the configured settings (TESSERA_MODELS / "
                    "TESSERA_CONFIG). Honours HF_HOME, HF_TOKEN and HF_ENDPOINT.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    download.add_argument("models", nargs="*", metavar="MODEL", help="Hub ids (org/name)")
    download.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    download.add_argument("--backend", default="auto", help="the backend whose files to fetch: "
                          "auto (weights and the ONNX graph when there is one) | " + " | ".join(backend_names()))
    download.add_argument("--dtype", default="float32", help="the dtype whose ONNX graph to fetch")
    _add_prepare(sub)
    from core.bulk.cli import add_batch_transform_parser, add_embed_parser

    add_embed_parser(sub)
    add_batch_transform_parser(sub)
    return parser


_COMPAT_EPILOG = (
    "Infinity's and TEI's command lines work too: `v2 --model-id ID [--model-id ID2] --batch-size N --engine "
    "optimum ...` (infinity_emb) and `--model-id ID --port N --max-batch-tokens N ...` (text-embeddings-router); "
    "their flags: " + " ".join(["--model-id", *dict.fromkeys(p.flag for p in cli_compat.PER_MODEL),
                                *(g.flag for g in cli_compat.GLOBAL)])
    + ". Per-model flags repeat per --model-id (one value: every model); INFINITY_* variables stand for "
    "Infinity's flags. docs/configuration.md has the table.").replace("%", "%%")


def _add_prepare(sub) -> None:
    prepare = sub.add_parser(
        "prepare", help="fill the export cache ahead of time (image builds, volume seeding): the same choice "
        "`serve` makes, so a later start finds each model's checked ONNX graph instead of exporting it")
    prepare.add_argument("--model", action="append", default=[], metavar="PATH[:NAME]",
                         help="a model folder (repeatable); default: TESSERA_MODELS / TESSERA_CONFIG, else the "
                              "embedded default model")
    prepare.add_argument("--cache-dir", dest="cache_dir", default=None,
                         help="export cache (env TESSERA_CACHE_DIR; default under the user's cache directory)")


def prepare(settings: Settings) -> int:
    """Choose each configured model's backend as ``serve`` would, with the export on; print one line per
    model. Exit status 1 when a model could not be prepared (its export or check failed, or it is broken)."""
    import logging

    from core.backends.registry import choose
    from core.loading import detect_task, read_model_info
    from core.tasks import task_class

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    status = 0
    for spec in settings.model_specs():
        try:
            info = read_model_info(spec.path, max_length=spec.max_length)
            task = detect_task(info) if spec.task == "auto" else spec.task
            choice = choose(spec, head=task_class(task).head, cache_dir=settings.cache_dir, auto_export=True)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per model; the others are still prepared
            print(f"{spec.served_name}: failed: {type(exc).__name__}: {exc}")
            status = 1
            continue
        print(f"{spec.served_name}: {choice.backend} ({choice.reason})")
        if choice.fell_back:
            status = 1
    return status


def settings_from_args(args: argparse.Namespace, compat: cli_compat.Compat | None = None) -> Settings:
    """``serve``'s (or ``prepare``'s) options over the environment; ``compat``: what Infinity's or TEI's
    flags asked for (core.cli_compat), under Tessera's own options."""
    compat = compat or cli_compat.Compat()
    given = {**compat.settings}
    given.update({k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None})
    if given.get("api_keys"):
        given["api_keys"] = cli_compat.api_key_values(given["api_keys"])
    specs = [_parse_model(m) for m in args.model]
    for spec in specs:
        if getattr(args, "backend", None):
            spec.setdefault("backend", args.backend)  # a spec's own wins
        if getattr(args, "revision", None):
            spec["revision"] = args.revision
    specs = compat.apply(specs)
    if specs:
        given["models"] = specs
    return settings_from_env(os.environ, **given)


def download(args: argparse.Namespace) -> int:
    """Fetch every MODEL (or the configured Hub models); one line per model, errors on stderr."""
    from core.hub import fetch, hub_id_of

    if args.models:
        specs = [ModelSpec(path=m, revision=args.revision, backend=args.backend, dtype=args.dtype) for m in args.models]
    else:
        specs = Settings().model_specs()
    failures = 0
    for spec in specs:
        repo_id = hub_id_of(spec.path)
        if repo_id is None:
            if spec.path.is_dir():
                print(f"{spec.path}: a local folder, nothing to fetch")
                continue
            print(f"error: {str(spec.path)!r} is neither a local folder nor a Hugging Face Hub id (org/name)",
                  file=sys.stderr)
            failures += 1
            continue
        try:
            folder, sha = fetch(repo_id, revision=spec.revision, backend=spec.backend, dtype=spec.dtype,
                                options=spec.backend_options(), trust_remote_code=spec.trust_remote_code)
        except TesseraError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            failures += 1
            continue
        print(f"{repo_id} {sha} {folder}")
    return 1 if failures else 0


def _known_options(parser: argparse.ArgumentParser, command: str | None) -> list[str]:
    """The long options of ``command`` (and of the compatibility layer, for ``serve``)."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen = subparsers.choices.get(command or "serve", subparsers.choices["serve"])
    known = [o for a in chosen._actions for o in a.option_strings if o.startswith("--")]
    return known + (cli_compat.compat_flags() if chosen is subparsers.choices["serve"] else [])


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (None: it can), checked with a bind as uvicorn will bind."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError as exc:
            from core.supervisor import port_taken_message

            return port_taken_message(host, port, exc)
    return None


def quiet_progress_bars(environ, stream) -> None:
    """Progress bars (transformers' and huggingface_hub's tqdm) only on a terminal: in a server log they
    would be lines of another format, redrawn with carriage returns. Set where the user has not."""
    if not stream.isatty():
        environ.setdefault("TQDM_DISABLE", "1")
        environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _stopped(doing: str) -> None:
    """Ctrl-C while models load or export: stop now, without a traceback (exit status 130). A first start's
    export runs on the torch thread, which the interpreter would otherwise wait for at exit."""
    print(f"tessera: stopped while {doing} models (Ctrl-C)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)


class UsageError(ConfigError):
    """A command line no parser took (unknown options, with the nearest known ones)."""


def read_command_line(argv: list[str], environ) -> tuple[argparse.Namespace, cli_compat.Compat | None]:
    """``argv`` (Tessera's, Infinity's or TEI's form) as the parsed command and what Infinity's/TEI's flags
    and ``INFINITY_*`` variables of ``environ`` asked for (``serve`` only). Raises ConfigError."""
    argv = cli_compat.normalise_command(list(argv))
    parser = build_parser()
    compat = None
    if argv and argv[0] == "serve":
        compat, rest = cli_compat.parse(argv[1:], environ)
        argv = ["serve", *rest]
    args, extras = parser.parse_known_args(argv)
    if extras:
        raise UsageError([cli_compat.unknown_options(extras, _known_options(parser, args.command))])
    return args, compat


def main(argv: list[str] | None = None) -> int:
    try:
        args, compat = read_command_line(sys.argv[1:] if argv is None else argv, os.environ)
    except UsageError as exc:  # one line, as argparse's own errors
        build_parser().print_usage(sys.stderr)
        print(f"tessera: {'; '.join(exc.problems)}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"tessera: {exc.message}", file=sys.stderr)
        return 2
    if args.command == "download":
        return download(args)
    for note in compat.notes if compat is not None else ():
        print(f"tessera: note: {note}", file=sys.stderr)
    try:
        settings = settings_from_args(args, compat)
    except ConfigError as exc:
        print(f"tessera: {exc.message}", file=sys.stderr)
        return 2
    if compat is not None:
        os.environ.update(compat.environ)  # --hf-token, --otlp-endpoint...: for the libraries that read them
    if args.command == "prepare" or (compat is not None and compat.preload_only):
        try:
            return prepare(settings)
        except KeyboardInterrupt:
            _stopped("preparing")
    if args.command == "embed":  # a corpus job (core/bulk)
        from core.bulk.cli import run_embed

        return run_embed(args, settings)
    if args.command == "batch-transform":  # SageMaker Batch Transform's input and output (core/bulk)
        from core.bulk.cli import run_batch_transform

        return run_batch_transform(args, settings)
    from core.api.app import create_app
    from core.engine import Registry
    from core.logs import configure_logging, uvicorn_log_options
    from core.metrics import Metrics
    from core.tracing import tracer_from_env

    configure_logging(settings.log_level, fmt=settings.log_format)
    quiet_progress_bars(os.environ, sys.stderr)
    try:
        tracer = tracer_from_env(os.environ)
    except ConfigError as exc:
        print(f"tessera: {exc.message}", file=sys.stderr)
        return 2
    from core.api.http_limits import http_options
    from core.frontends import plan_for

    plan = plan_for(settings)
    if plan.count > 1:  # a supervisor, the executors and the front ends (core/supervisor.py)
        from core.api.frontend import serve_with_frontends

        return serve_with_frontends(settings, plan)
    logging.getLogger("tessera").info("one process: %s", plan.reason)
    taken = port_in_use(settings.host, int(settings.port))  # before minutes of loading, not after
    if taken:
        print(f"tessera: {taken}", file=sys.stderr)
        return 1
    # load before listening (as the lifespan would), so a start-up that cannot serve exits with its reason
    metrics = Metrics()
    try:
        registry = Registry.from_settings(settings, metrics, tracer)
    except KeyboardInterrupt:
        _stopped("loading")
    try:
        registry.raise_if_unusable()
    except StartupFailed as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    app = create_app(settings, registry, metrics=metrics, tracer=tracer)
    app.state.frontends = plan
    return run_uvicorn(app, host=settings.host, port=int(settings.port), loop="auto",
                       **http_options(settings.max_header_bytes), access_log=False,
                       log_level=settings.log_level.lower(),
                       timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),  # 0: stop now
                       **uvicorn_log_options(settings.log_format))


def run_uvicorn(app, **options) -> int:
    """``uvicorn.run(app)`` with the lifespan required (``lifespan="on"``: a start-up that fails stops the
    server instead of leaving one that answers 500), and the reason of such a failure printed last, in one
    line (``app.state.startup_failure``, core.api.app); exit status 1 then, 0 after a normal stop."""
    import uvicorn

    try:
        uvicorn.run(app, lifespan="on", **options)
    except SystemExit:
        failure = getattr(app.state, "startup_failure", None)
        if failure is None:
            raise
        print(f"tessera: {failure}", file=sys.stderr, flush=True)
        return 1
    return 0

