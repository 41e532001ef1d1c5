"""``python -m core serve [--model PATH[:NAME]]... [--port N] ...`` over the same Settings.

Every Settings field becomes an option (``--max-request-bytes``), each listing its ``TESSERA_`` variable;
options given on the command line win over the environment.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys

from core.config import ModelSpec, Settings, settings_from_env
from core.errors import ConfigError

_SKIP = {"models"}  # given as --model / --models-json


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


#: a spec begins with ``key=`` (a field of ModelSpec, ``prompt`` or ``prompt.NAME``)
_SPEC_KEY = re.compile(r"^\s*(" + "|".join(ModelSpec.model_fields) + r"|prompt(\.[^=,]+)?)\s*=")
#: list fields, given with ';' between items (providers=CUDAExecutionProvider;CPUExecutionProvider)
_LIST_FIELDS = {"providers"}


def parse_model_spec(value: str) -> dict:
    """``path=/models/e5,name=e5,backend=onnx,dtype=int8,prompt=query: `` → a ModelSpec's fields.

    Items are ``key=value`` separated by commas; an item holding a comma is quoted as a whole
    (``"prompt=query, then: "``). ``prompt=TEXT`` sets the prompt used when a request names none
    (``prompts.default`` and ``default_prompt_name``); ``prompt.NAME=TEXT`` adds a named prompt; list
    fields take ``;``-separated items. Types and unknown keys are checked with the other settings."""
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
        elif key in _LIST_FIELDS:
            spec[key] = [part.strip() for part in text.split(";") if part.strip()]
        elif key in spec:
            raise ConfigError([f"--model {value!r}: {key!r} given twice"])
        else:
            spec[key] = text
    if "path" not in spec:
        raise ConfigError([f"--model {value!r}: a spec needs path=..."])
    return spec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m core", description="Tessera: serve embedding models")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve models over HTTP (uvicorn)",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--model", action="append", default=[], metavar="PATH[:NAME] | path=PATH,KEY=VALUE,...",
                       help="a model folder to serve, optionally with its served name, or a spec in one line "
                            "(e.g. path=/m/e5,name=e5,backend=onnx,dtype=int8,prompt='query: '; prompt.NAME=TEXT "
                            "adds a named prompt) or a JSON object (repeatable); env TESSERA_MODELS (JSON list). "
                            "Fields: " + ", ".join(ModelSpec.model_fields))
    serve.add_argument("--backend", default=None, help="backend for every --model: auto | torch | onnx")
    for name, field in Settings.model_fields.items():
        if name in _SKIP:
            continue
        env = f"TESSERA_{name.upper()}"
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description or name} (env {env})"
        if field.annotation is bool:
            serve.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif name == "api_keys":
            serve.add_argument("--api-key", dest="api_keys", action="append", default=None, help=help_text)
        else:
            serve.add_argument(flag, dest=name, default=None, help=help_text)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    if args.model:
        specs = [_parse_model(m) for m in args.model]
        if args.backend:
            for spec in specs:
                spec.setdefault("backend", args.backend)
        given["models"] = specs
    return settings_from_env(os.environ, **given)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"tessera: {exc.message}", file=sys.stderr)
        return 2
    import uvicorn

    from core.api.app import create_app
    from core.logs import configure_logging, uvicorn_log_options
    from core.tracing import tracer_from_env

    configure_logging(settings.log_level, fmt=settings.log_format)
    try:
        tracer = tracer_from_env(os.environ)
    except ConfigError as exc:
        print(f"tessera: {exc.message}", file=sys.stderr)
        return 2
    from core.api.http_limits import http_options

    uvicorn.run(create_app(settings, tracer=tracer), host=settings.host, port=int(settings.port), loop="auto",
                **http_options(settings.max_header_bytes), access_log=False, log_level=settings.log_level,
                timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),  # 0: stop now
                **uvicorn_log_options(settings.log_format))
    return 0
