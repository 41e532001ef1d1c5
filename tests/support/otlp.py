"""An OTLP/HTTP trace collector stand-in on 127.0.0.1: decodes each ``POST /v1/traces`` body as the
real collector does (``ExportTraceServiceRequest``, opentelemetry-proto) and keeps the spans."""

from __future__ import annotations

import gzip
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from benchmarks.loopback import Handler, LoopbackServer


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


@dataclass
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict
    status_code: int
    start_ns: int
    end_ns: int
    resource: dict = field(default_factory=dict)


class Collector:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts: list[str] = []  # path of every export received
        self._lock = threading.Lock()
        outer = self

        class CollectorHandler(Handler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                outer._keep(self.path, request)
                self.reply(200, ExportTraceServiceResponse().SerializeToString(),
                           {"Content-Type": "application/x-protobuf"})

        self._http = LoopbackServer(CollectorHandler, name="otlp-collector")
        self.endpoint = self._http.url

    def _keep(self, path: str, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.posts.append(path)
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        self.spans.append(Span(
                            trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(),
                            name=s.name, kind=s.kind, attributes={a.key: _value(a.value) for a in s.attributes},
                            status_code=s.status.code, start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                            resource=resource))

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, predicate, timeout: float = 30.0) -> list[Span]:
        """Poll (bounded) until ``predicate(spans)`` holds; returns all spans received."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not received within {timeout}s: {[(s.name, s.trace_id) for s in spans]}")
            time.sleep(0.05)

    @contextmanager
    def running(self):
        with self._http:
            yield self
