"""``python -m core serve [--model PATH[:NAME]]... [--port N] ...`` over the same Settings, and
``python -m core download [MODEL...] [--revision R] [--backend B]`` (Hub models into the Hugging Face cache).

Every Settings field becomes an option of ``serve`` (``--max-request-bytes``), each listing its ``TESSERA_``
variable; options given on the command line win over the environment.
"""

from __future__ import annotations

import math
import sys

import argparse

from core.config import ModelSpec, Settings
from core.errors import StartupFailed, TesseraError

_SKIP = {"models"}  # given as --model / --models-json


def _parse_model(value: str) -> dict:
    path, sep, name = value.rpartition(":")
    if not sep or not path or "/" in name:  # no NAME part (or a ':' inside the path)
        path, name = value, ""
    spec = {"path": path}
    if name:
        spec["name"] = name
    return spec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m core", description="Tessera: serve embedding models")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve models over HTTP (uvicorn)",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--model", action="append", default=[], metavar="PATH[:NAME]",
                       help="a model folder or Hugging Face Hub id (org/name) to serve, optionally with its "
                            "served name (repeatable); "
                            "env TESSERA_MODELS (JSON list of specs with more fields: "
                            + ", ".join(ModelSpec.model_fields) + ")")
    serve.add_argument("--backend", default=None, help="backend for every --model: auto | torch | onnx")
    serve.add_argument("--revision", default=None,
                       help="Hub branch, tag or commit for every --model (each must then be a Hub id)")
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
    download = sub.add_parser(
        "download", help="fetch Hugging Face Hub models into the Hugging Face cache (HF_HOME), for serving offline",
        description="Fetch each MODEL (a Hub id org/name) into the Hugging Face cache, only the files BACKEND "
                    "reads; without MODEL, the Hub models of the configured settings (TESSERA_MODELS / "
                    "TESSERA_CONFIG). Honours HF_HOME, HF_TOKEN and HF_ENDPOINT.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    download.add_argument("models", nargs="*", metavar="MODEL", help="Hub ids (org/name)")
    download.add_argument("--revision", default=None, help="branch, tag or commit (default: main)")
    download.add_argument("--backend", default="auto", help="the backend whose files to fetch: "
                          "auto (weights and the ONNX graph when there is one) | torch | onnx | ct2 | neuron")
    download.add_argument("--dtype", default="float32", help="the dtype whose ONNX graph to fetch")
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    if args.model:
        specs = [_parse_model(m) for m in args.model]
        for spec in specs:
            if args.backend:
                spec["backend"] = args.backend
            if args.revision:
                spec["revision"] = args.revision
        given["models"] = specs
    return Settings(**given)


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
                                onnx_file=spec.onnx_file, trust_remote_code=spec.trust_remote_code)
        except TesseraError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            failures += 1
            continue
        print(f"{repo_id} {sha} {folder}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "download":
        return download(args)
    settings = settings_from_args(args)
    import uvicorn

    from core.api.app import create_app
    from core.engine import Registry
    from core.logs import configure_logging
    from core.metrics import Metrics

    configure_logging(settings.log_level)
    from core.api.http_limits import http_options

    # load before listening (as the lifespan would), so a start-up that cannot serve exits with its reason
    metrics = Metrics()
    registry = Registry.from_settings(settings, metrics)
    try:
        registry.raise_if_unusable()
    except StartupFailed as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    app = create_app(settings, registry, metrics=metrics)
    uvicorn.run(app, host=settings.host, port=int(settings.port), loop="auto",
                **http_options(settings.max_header_bytes), access_log=False, log_level=settings.log_level,
                timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s))  # 0: stop now
    return 0
