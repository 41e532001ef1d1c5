"""OpenTelemetry traces, configured by the standard ``OTEL_*`` variables, or nothing at all.

:func:`tracer_from_env` is called once at a surface's edge and the tracer it returns is passed down
(app → registry → engine → batcher). Without ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT`` it returns :data:`NO_TRACER`, whose methods do nothing and which imports
nothing from OpenTelemetry; the tracing middleware is then not even installed. With an endpoint it
needs the ``[otel]`` extra (``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http``).

Read here: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL) or ``OTEL_EXPORTER_OTLP_ENDPOINT``
(a base URL: ``/v1/traces`` is added), ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` (``http/protobuf``;
``grpc`` when ``opentelemetry-exporter-otlp-proto-grpc`` is installed), ``OTEL_SERVICE_NAME``
(default ``tessera``), ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default
``parentbased_always_on``) and ``OTEL_SDK_DISABLED``. The exporter itself reads the others
(``…_HEADERS``, ``…_TIMEOUT``, ``…_COMPRESSION``, TLS files) and the span processor ``OTEL_BSP_*``.

Spans (see docs/operations.md): the HTTP request (SERVER, joined to the caller's W3C ``traceparent``),
``media.fetch``, ``tokenize``, ``queue`` and ``batch``. Attributes hold names and counts only, never
input text, media URLs or keys.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any, Iterable, Mapping

from core.errors import ConfigError, MissingDependency, install_hint

log = logging.getLogger(__name__)

_NULL = nullcontext()


class NoTracer:
    """Tracing off: every method is a no-op (``span`` yields None)."""

    enabled = False

    def span(self, name: str, attributes: Mapping[str, Any] | None = None):
        return _NULL

    def context(self) -> Any:
        return None

    def record(self, name: str, parent: Any, start_ns: int, end_ns: int, attributes: Mapping[str, Any],
               error: BaseException | None = None) -> None:
        return None

    def shutdown(self) -> None:
        return None


NO_TRACER = NoTracer()


class OtelTracer:
    """Spans through an OpenTelemetry SDK ``TracerProvider`` of our own (the global provider is left
    alone, so an application embedding Tessera keeps its own)."""

    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("tessera")
        self._context = otel_context
        self._propagator = TraceContextTextMapPropagator()
        self._server = SpanKind.SERVER
        self._status, self._error = Status, StatusCode.ERROR

    # the request (core.api.observability.Tracing) ---------------------------------------------
    def extract(self, headers: Iterable[tuple[bytes, bytes]]) -> Any:
        """The caller's context from its ``traceparent``/``tracestate`` headers (none: a new trace)."""
        carrier = {}
        for name, value in headers:
            if name in (b"traceparent", b"tracestate"):
                carrier[name.decode("latin-1")] = value.decode("latin-1")
        return self._propagator.extract(carrier) if carrier else None

    def server_span(self, name: str, parent: Any, attributes: Mapping[str, Any]):
        return self._tracer.start_as_current_span(name, context=parent, kind=self._server, attributes=attributes,
                                                  record_exception=False, set_status_on_exception=False)

    def fail(self, span: Any, what: str) -> None:
        span.set_status(self._status(self._error, what))

    # inside the request ------------------------------------------------------------------------
    def span(self, name: str, attributes: Mapping[str, Any] | None = None):
        """A child of the current span (exceptions mark it failed by their type only: messages may
        quote input)."""
        return _ChildSpan(self, name, attributes)

    def context(self) -> Any:
        return self._context.get_current()

    def record(self, name: str, parent: Any, start_ns: int, end_ns: int, attributes: Mapping[str, Any],
               error: BaseException | None = None) -> None:
        """A finished span with given times under ``parent`` (a context captured earlier: the batcher
        records queue and batch spans into each request's trace from its own task)."""
        span = self._tracer.start_span(name, context=parent, start_time=start_ns, attributes=attributes)
        if error is not None:
            self.fail(span, type(error).__name__)
        span.end(end_time=end_ns)

    def shutdown(self) -> None:
        """Export what is buffered and stop (the app's shutdown calls it)."""
        self.provider.shutdown()


class _ChildSpan:
    __slots__ = ("tracer", "name", "attributes", "cm", "span")

    def __init__(self, tracer: OtelTracer, name: str, attributes: Mapping[str, Any] | None) -> None:
        self.tracer, self.name, self.attributes = tracer, name, attributes

    def __enter__(self) -> Any:
        self.cm = self.tracer._tracer.start_as_current_span(self.name, attributes=self.attributes,
                                                            record_exception=False, set_status_on_exception=False)
        self.span = self.cm.__enter__()
        return self.span

    def __exit__(self, exc_type, exc, tb) -> bool | None:
        if exc_type is not None:
            self.tracer.fail(self.span, exc_type.__name__)
        return self.cm.__exit__(exc_type, exc, tb)


def _endpoint(environ: Mapping[str, str]) -> str | None:
    traces = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        return base.rstrip("/") + "/v1/traces"
    return None


_SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
             "parentbased_traceidratio")


def _sampler(environ: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.trace import sampling

    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower() or "parentbased_always_on"
    if name not in _SAMPLERS:
        raise ConfigError([f"OTEL_TRACES_SAMPLER: unknown sampler {name!r}; one of {', '.join(_SAMPLERS)}"])
    ratio = 1.0
    if name.endswith("traceidratio"):
        arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0").strip() or "1.0"
        try:
            ratio = float(arg)
        except ValueError:
            raise ConfigError([f"OTEL_TRACES_SAMPLER_ARG: not a number (got {arg!r})"]) from None
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError([f"OTEL_TRACES_SAMPLER_ARG: a ratio in [0, 1] (got {arg!r})"])
    return {
        "always_on": lambda: sampling.ALWAYS_ON,
        "always_off": lambda: sampling.ALWAYS_OFF,
        "traceidratio": lambda: sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda: sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": lambda: sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": lambda: sampling.ParentBased(sampling.TraceIdRatioBased(ratio)),
    }[name]()


def _exporter(environ: Mapping[str, str], endpoint: str) -> Any:
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip().lower()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        except ImportError:
            raise MissingDependency("OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                                    "(pip install opentelemetry-exporter-otlp-proto-grpc); the [otel] extra "
                                    "exports over http/protobuf") from None
        return GrpcExporter(endpoint=environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                            or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    raise ConfigError([f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported; use http/protobuf or grpc"])


def tracer_from_env(environ: Mapping[str, str]) -> NoTracer | OtelTracer:
    """The tracer the ``OTEL_*`` variables in ``environ`` ask for: :data:`NO_TRACER` without an OTLP
    endpoint (or with ``OTEL_SDK_DISABLED=true``), else an OTLP exporter behind a batch span processor.
    An endpoint without the ``[otel]`` extra installed raises :class:`MissingDependency` naming it."""
    endpoint = _endpoint(environ)
    if endpoint is None or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return NO_TRACER
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_EXPORTER_OTLP_*ENDPOINT is set but tracing is off: it needs the otel extra (%s)",
                    install_hint("otel"))
        return NO_TRACER
    service = environ.get("OTEL_SERVICE_NAME", "").strip() or "tessera"
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=_sampler(environ))
    provider.add_span_processor(BatchSpanProcessor(_exporter(environ, endpoint)))
    log.info("tracing: OTLP spans to %s as service %r", endpoint, service)
    return OtelTracer(provider)
