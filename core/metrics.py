"""Prometheus metrics, one registry per app (no global state, so several apps can live in one process)."""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter as Tally
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

if TYPE_CHECKING:
    from core.batching import BatchStats

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)
_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        #: False while muted (the app's start-up warm pass): observations touch their label series, count nothing
        self.recording = True
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("tessera_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.request_seconds = Histogram(
            "tessera_request_seconds", "HTTP request latency", ["route"], buckets=_TIME_BUCKETS, registry=r
        )
        self.queue_depth = Gauge("tessera_queue_depth", "items waiting for a batch", ["model"], registry=r)
        self.batch_size = Histogram("tessera_batch_size", "items per batch", ["model"], buckets=_SIZE_BUCKETS, registry=r)
        self.batch_tokens = Histogram(
            "tessera_batch_tokens", "real tokens per batch", ["model"], buckets=_TOKEN_BUCKETS, registry=r
        )
        self.batch_padded_tokens = Histogram(
            "tessera_batch_padded_tokens", "padded tokens per batch", ["model"], buckets=_TOKEN_BUCKETS, registry=r
        )
        self.queue_seconds = Histogram(
            "tessera_queue_seconds", "time an item waited in the queue", ["model"], buckets=_TIME_BUCKETS, registry=r
        )
        self.inference_seconds = Histogram(
            "tessera_inference_seconds", "time of one batch in the backend (incl. collate/pool)", ["model"],
            buckets=_TIME_BUCKETS, registry=r,
        )
        self.batch_failures = Counter("tessera_batch_failures", "batches that failed", ["model"], registry=r)
        self.dropped = Counter(
            "tessera_dropped_items", "queued items dropped before inference", ["model", "reason"], registry=r
        )
        # what an operator alerts on (docs/operations.md has example rules)
        self.rejected = Counter(
            "tessera_rejected_requests", "requests refused or cut short, by reason: queue_full, inflight_limit, "
            "draining, not_ready, timeout, body_timeout, body_too_large, too_large, too_many_tokens, unauthorized",
            ["reason"], registry=r,
        )
        self.inflight = Gauge("tessera_inflight_requests", "requests in progress (the in-flight cap counts these)",
                              registry=r)
        self.model_load_failures = Counter(
            "tessera_model_load_failures", "models that failed to load at start-up", ["model"], registry=r
        )
        self.models_loaded = Gauge("tessera_models_loaded", "models loaded and serving", registry=r)
        # the embedding cache (core/cache)
        self.cache_hits = Counter("tessera_embedding_cache_hits", "inputs answered by the embedding cache",
                                  ["model"], registry=r)
        self.cache_misses = Counter("tessera_embedding_cache_misses", "distinct inputs the embedding cache did not "
                                    "hold (computed, then stored)", ["model"], registry=r)
        #: the label series observed on every request and batch, looked up once (``labels()`` checks and locks:
        #: ~2 µs a request)
        self._request_series: dict[tuple[str, int], tuple] = {}
        self._batch_series: dict[str, tuple] = {}
        self.cache_errors = Counter("tessera_embedding_cache_errors", "embedding cache operations that failed "
                                    "(the request was served without the cache)", ["op"], registry=r)
        self.cache_bad_values = Counter("tessera_embedding_cache_bad_values", "values read from the embedding cache "
                                        "that failed their check (layout, dimension, finiteness, token count): "
                                        "served as misses", ["model"], registry=r)

    @contextmanager
    def muted(self) -> Iterator[None]:
        """Count nothing inside: for work that is not the users' (the start-up warm pass, which runs before
        the server serves, so no user request can fall inside it)."""
        self.recording = False
        try:
            yield
        finally:
            self.recording = True

    def observe_batch(self, model: str, stats: "BatchStats", depth: int) -> None:
        series = self._batch_series.get(model)
        if series is None:
            series = self._batch_series[model] = (
                self.batch_size.labels(model), self.batch_tokens.labels(model), self.batch_padded_tokens.labels(model),
                self.inference_seconds.labels(model), self.queue_seconds.labels(model), self.queue_depth.labels(model))
        size, tokens, padded, run, queue, queue_depth = series
        if not self.recording:
            return
        size.observe(stats.size)
        tokens.observe(stats.tokens)
        padded.observe(stats.padded_tokens)
        run.observe(stats.run_seconds)
        observe_each(queue, stats.queue_seconds)
        queue_depth.set(depth)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        series = self._request_series.get((route, status))
        if series is None:  # routes and statuses are few: each pair's series is looked up once
            series = self._request_series[(route, status)] = (self.requests.labels(route, str(status)),
                                                              self.request_seconds.labels(route))
        requests, latency = series
        if self.recording:
            requests.inc()
            latency.observe(seconds)

    def count_rejection(self, reason: str) -> None:
        if self.recording:
            self.rejected.labels(reason).inc()

    def count_drop(self, model: str, reason: str) -> None:
        if self.recording:
            self.dropped.labels(model, reason).inc()

    def count_batch_failure(self, model: str) -> None:
        if self.recording:
            self.batch_failures.labels(model).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def observe_each(histogram: Histogram, values: Iterable[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (a batch's items' queue times), with one increment per
    bucket hit and one of the sum instead of a walk over the buckets and two locked increments per value.
    A histogram without prometheus_client's usual parts (``_upper_bounds``, ``_buckets``, ``_sum``) is
    observed value by value."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    values = list(values)
    for bucket, n in Tally(bisect_left(bounds, v) for v in values if v == v).items():  # a NaN: in no bucket
        buckets[bucket].inc(n)
    total.inc(sum(values))
