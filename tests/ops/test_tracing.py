"""OpenTelemetry traces from a real server (``python -m core serve``) to an OTLP/HTTP collector
stand-in on loopback that decodes what it receives (opentelemetry-proto): the caller's trace joined,
the parent of every span, span names and attributes, and no input text or key anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.multimodal.media_support import MediaServer, Route, png
from tests.ops.conftest import cli_server
from tests.support.otlp import Collector

SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
KEY = "sk-ops-test-key-5c9e1d"
SECRET_TEXT = "the quick zebra named Ophelia-7f3a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
IMAGE_TRACE = "a3ce929d0e0e47364bf92f3577b34da6"


@pytest.fixture(scope="module")
def traced(minilm_onnx_dir, clip_dir):
    media = MediaServer()
    media.add("/red.png", Route(png(), "image/png"))
    with Collector().running() as collector, media.running():
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,  # base URL: the SDK posts to /v1/traces
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "tessera-ops-test",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after a span ends
            "TESSERA_API_KEYS": f'["{KEY}"]',
            "TESSERA_MEDIA_ALLOW": '["127.0.0.1/32"]',
        }
        args = ["--model", f"path={minilm_onnx_dir},name=minilm,backend=onnx",
                "--model", f"path={clip_dir},name=clip"]
        with cli_server(args, env, headers={"Authorization": f"Bearer {KEY}"}, name="otel") as (base, log):
            yield base, collector, media


def _by_name(spans, name):
    found = [s for s in spans if s.name == name]
    assert found, f"no {name!r} span among {[s.name for s in spans]}"
    return found


def _all_values(spans) -> list[str]:
    return [str(v) for s in spans for v in [*s.attributes.values(), *s.resource.values(), s.name]]


def test_request_joins_the_callers_trace_with_queue_tokenize_and_batch_spans(traced):
    base, collector, _ = traced
    r = httpx.post(f"{base}/v1/embeddings", json={"model": "minilm", "input": [SECRET_TEXT, "a second text"]},
                   headers={"Authorization": f"Bearer {KEY}", "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
                            "X-Request-Id": "trace-req-1"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "trace-req-1"

    def complete(spans):
        names = {s.name for s in spans if s.trace_id == TRACE_ID}
        return {"POST /v1/embeddings", "tokenize", "queue", "batch"} <= names

    collector.wait_for(complete)
    spans = collector.trace(TRACE_ID)
    (server,) = _by_name(spans, "POST /v1/embeddings")
    assert server.parent_span_id == CALLER_SPAN  # joined, not a new trace
    assert server.kind == SERVER_KIND
    a = server.attributes
    assert a["http.route"] == "/v1/embeddings" and a["http.request.method"] == "POST"
    assert a["http.response.status_code"] == 200
    assert a["tessera.model"] == "minilm" and a["tessera.inputs"] == 2 and a["tessera.tokens"] > 4
    assert a["tessera.request_id"] == "trace-req-1"
    assert server.resource["service.name"] == "tessera-ops-test"

    for name in ("tokenize", "queue", "batch"):
        for child in _by_name(spans, name):
            assert child.parent_span_id == server.span_id, (name, child)
            assert server.start_ns <= child.start_ns <= child.end_ns <= server.end_ns, name
    (tokenize,) = _by_name(spans, "tokenize")
    assert tokenize.attributes["tessera.inputs"] == 2 and tokenize.attributes["tessera.tokens"] == a["tessera.tokens"]
    (queue,) = _by_name(spans, "queue")
    batches = _by_name(spans, "batch")
    assert queue.end_ns <= min(b.start_ns for b in batches)
    for b in batches:
        ba = b.attributes
        assert ba["tessera.backend"] == "onnx" and ba["tessera.device"] == "cpu" and ba["tessera.model"] == "minilm"
        assert 1 <= ba["tessera.batch.request_items"] <= ba["tessera.batch.size"]
        assert ba["tessera.batch.padded_tokens"] >= ba["tessera.batch.tokens"] > 0
    assert sum(b.attributes["tessera.batch.request_items"] for b in batches) == 2

    values = _all_values(collector.spans)
    assert not [v for v in values if "Ophelia" in v or KEY in v], "input text or key in a span"


def test_media_fetch_span_and_a_new_trace_without_traceparent(traced):
    base, collector, media = traced
    image = {"model": "clip", "modality": "image", "input": [f"{media.base}/red.png"]}
    r = httpx.post(f"{base}/v1/embeddings", json=image, timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "traceparent": f"00-{IMAGE_TRACE}-{CALLER_SPAN}-01"})
    assert r.status_code == 200, r.text
    assert any(path == "/red.png" for path, _ in media.requests)
    collector.wait_for(lambda spans: {"media.fetch", "batch"} <= {s.name for s in spans if s.trace_id == IMAGE_TRACE})
    spans = collector.trace(IMAGE_TRACE)
    (server,) = [s for s in spans if s.kind == SERVER_KIND]
    (fetch,) = _by_name(spans, "media.fetch")
    assert fetch.parent_span_id == server.span_id and fetch.attributes["tessera.model"] == "clip"
    assert not [v for v in _all_values(spans) if "red.png" in v or media.base in v], "a media URL in a span"

    r = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "untraced-call"})
    assert r.status_code == 200
    spans = collector.wait_for(lambda s: any(x.attributes.get("tessera.request_id") == "untraced-call" for x in s))
    (root,) = [s for s in spans if s.attributes.get("tessera.request_id") == "untraced-call"]
    assert root.parent_span_id == "" and root.trace_id not in (TRACE_ID, IMAGE_TRACE)
    assert root.name == "GET /v1/models"


def test_refusals_are_traced_too(traced):
    base, collector, _ = traced
    trace = "0e0e47364bf92f3577b34da6a3ce929d"
    r = httpx.post(f"{base}/v1/embeddings", json={"input": SECRET_TEXT}, timeout=30,
                   headers={"Authorization": "Bearer wrong-key", "traceparent": f"00-{trace}-{CALLER_SPAN}-01"})
    assert r.status_code == 401
    collector.wait_for(lambda spans: any(s.trace_id == trace for s in spans))
    (server,) = collector.trace(trace)
    assert server.attributes["http.response.status_code"] == 401
    assert server.attributes["error.type"] == "invalid_api_key"
    assert "wrong-key" not in " ".join(_all_values([server]))


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**full, **env}, capture_output=True,
                          text=True, timeout=120)


def test_off_without_an_endpoint_imports_no_sdk_and_adds_no_middleware():
    # fastapi itself imports opentelemetry-api; the SDK and the exporter must stay unimported
    out = _python("""
        import os, sys
        from core.api.app import create_app
        from core.api.observability import Tracing
        from core.config import Settings
        from core.tracing import NO_TRACER, tracer_from_env
        tracer = tracer_from_env(os.environ)
        assert tracer is NO_TRACER
        app = create_app(Settings(), tracer=tracer)
        assert Tracing not in [m.cls for m in app.user_middleware]
        loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "opentelemetry.exporter")))
        print("LOADED", loaded)
    """, {})
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout


def test_a_global_tracer_provider_gets_no_spans_or_metrics_from_fastapi_itself():
    """A process whose OpenTelemetry is set up globally (``opentelemetry-instrument``, a host app): the server's
    trace is Tessera's own (``Tracing``, under OTEL_EXPORTER_OTLP_ENDPOINT); FastAPI's native telemetry (newer
    FastAPI) would add a second SERVER span and its own metrics to every request, and is off."""
    out = _python("""
        import asyncio
        import httpx
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        from core.api.app import create_app
        from core.config import Settings
        async def main():
            app = create_app(Settings())
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for path in ("/health", "/v1/models", "/no-such-route"):
                    print(path, (await client.get(path)).status_code)
        asyncio.run(main())
        data = reader.get_metrics_data()
        names = [m.name for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics
                 for m in sm.metrics]
        print("SPANS", [s.name for s in spans.get_finished_spans()], "METRICS", names)
    """, {})
    assert out.returncode == 0, out.stderr
    assert "/health 200" in out.stdout and "/no-such-route 404" in out.stdout, out.stdout
    assert "SPANS [] METRICS []" in out.stdout, out.stdout


def test_endpoint_without_the_extra_warns_and_stays_off():
    out = _python("""
        import logging, sys
        class NoSdk:
            def find_spec(self, name, path=None, target=None):
                if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
                    raise ImportError("not installed")
        sys.meta_path.insert(0, NoSdk())
        logging.basicConfig()
        from core.tracing import NO_TRACER, tracer_from_env
        assert tracer_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}) is NO_TRACER
        print("OFF")
    """, {})
    assert out.returncode == 0, out.stderr
    assert "OFF" in out.stdout and "pip install -e '.[otel]'" in out.stderr


def test_sampler_and_endpoint_variables():
    from opentelemetry.sdk.trace import sampling

    from core.errors import ConfigError
    from core.tracing import NO_TRACER, _endpoint, tracer_from_env

    assert _endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"}) == "http://127.0.0.1:4318/v1/traces"
    assert _endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:2/t"}) \
        == "http://b:2/t"
    assert tracer_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}) is NO_TRACER
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces",
           "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    tracer = tracer_from_env(env)
    try:
        assert isinstance(tracer.provider.sampler, sampling.TraceIdRatioBased) and tracer.provider.sampler.rate == 0.25
    finally:
        tracer.shutdown()
    off = tracer_from_env({**env, "OTEL_TRACES_SAMPLER": "always_off"})
    try:
        assert off.provider.sampler is sampling.ALWAYS_OFF
    finally:
        off.shutdown()
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER"):
        tracer_from_env({**env, "OTEL_TRACES_SAMPLER": "sometimes"})
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        tracer_from_env({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
