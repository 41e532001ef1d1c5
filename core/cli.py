"""``python -m core serve [--model PATH[:NAME]]... [--port N] ...`` over the same Settings.

Every Settings field becomes an option (``--max-request-bytes``), each listing its ``TESSERA_`` variable;
options given on the command line win over the environment.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from core.backends.registry import BACKENDS
from core.config import ModelSpec, Settings, settings_from_env
from core.errors import ConfigError

_SKIP = {"models"}  # given as --model (or TESSERA_MODELS / a config file for full specs)


def _parse_model(value: str) -> dict:
    path, sep, name = value.rpartition(":")
    if not sep or not path or "/" in name:  # no NAME part (or a ':' inside the path)
        path, name = value, ""
    spec = {"path": path}
    if name:
        spec["name"] = name
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
    serve = sub.add_parser("serve", help="serve models over HTTP (uvicorn)")
    serve.add_argument("--model", action="append", default=[], metavar="PATH[:NAME]",
                       help="a model folder to serve, optionally with its served name (repeatable); "
                            "env TESSERA_MODELS (JSON list of specs with more fields: "
                            + ", ".join(ModelSpec.model_fields) + ")")
    serve.add_argument("--backend", default=None,
                       help="backend for every --model: " + " | ".join(["auto", *BACKENDS]) + " (default auto)")
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
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    if args.model:
        specs = [_parse_model(m) for m in args.model]
        if args.backend:
            for spec in specs:
                spec["backend"] = args.backend
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
    from core.logs import configure_logging

    configure_logging(settings.log_level)
    from core.api.http_limits import http_options

    uvicorn.run(create_app(settings), host=settings.host, port=int(settings.port), loop="auto",
                **http_options(settings.max_header_bytes), access_log=False, log_level=settings.log_level,
                timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s))  # 0: stop now
    return 0
