"""Engine (one model: task + backend + batcher) and Registry (many models, routed by served name)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from core.backends.base import Backend
from core.backends.registry import Choice, choose, create_backend
from core.batching import Batcher, BatchStats
from core.config import ModelSpec, Settings
from core.devices import is_accelerator, is_device_list
from core.errors import BackendFailure, ConfigError, ModelNotFound, NotReady, OutOfMemory, StartupFailed, TesseraError, TooLarge, Unsupported
from core.hub import resolve_source
from core.loading import detect_task, read_model_info
from core.metrics import Metrics
from core.preparing import Preparers
from core.request_context import note_work
from core.tasks import create_task, task_class
from core.tracing import NO_TRACER, NoTracer, OtelTracer
from core.tasks.base import RequestLimits, Task
from core.tasks.chunking import check_default as check_chunking_default
from core.tokenization import set_parallelism

log = logging.getLogger(__name__)

#: consecutive failed batches after which a model reports unhealthy on /ready
UNHEALTHY_AFTER = 3


class Engine:
    def __init__(self, spec: ModelSpec, task: Task, backend: Backend, *, settings: Settings, metrics: Metrics | None = None,
                 model_sha: str | None = None, tracer: NoTracer | OtelTracer = NO_TRACER):
        self.spec = spec
        self.tracer = tracer
        self.name = spec.served_name
        #: the commit served when the spec names a Hub id (None for a local folder); /v1/models and /info show it
        self.model_sha = model_sha
        self.task = task
        self.backend = backend
        self.metrics = metrics
        self.consecutive_failures = 0
        self.max_tokens_per_request = settings.max_tokens_per_request
        task.limits = RequestLimits(tokens=settings.max_tokens_per_request, items=settings.max_items_per_request,
                                    response_bytes=settings.max_response_bytes)
        self.last_error: str | None = None
        #: why this backend serves the model (``/v1/models``' backend_reason); set by ``load``
        self.choice = Choice(backend.name, "given to the engine")
        #: the effective batch limit: the backend's fixed compiled batch, else the spec's (the one place it is read)
        self.max_batch_size: int = backend.max_batch_size or spec.max_batch_size
        self._prep = Preparers(task.prepare, workers=settings.tokenizing_threads, name=f"prep-{self.name}")
        self.batcher = Batcher(
            self._run_batch,
            max_batch_tokens=spec.batch_tokens,
            max_batch_size=self.max_batch_size,
            max_queue_items=spec.max_queue_items,
            retry_after_s=settings.retry_after_s,
            workers=backend.lanes,
            # on an accelerator a batch lasts as long as the device takes, which the event loop must not wait for
            inline_below_s=0.0 if is_accelerator(spec.device) else spec.inline_batch_ms / 1000,
            name=self.name,
            on_batch=self._on_batch,
            on_error=self._on_error,
            on_success=self._on_success,
            on_drop=self._on_drop,
            tracer=tracer,
            span_attributes={"tessera.model": self.name, "tessera.backend": backend.name, "tessera.device": spec.device},
        )
        backend.share_threads = self.batcher.should_share_threads

    @classmethod
    def load(cls, spec: ModelSpec, settings: Settings, metrics: Metrics | None = None, *,
             warm_up: bool = True, tracer: NoTracer | OtelTracer = NO_TRACER) -> "Engine":
        """Read the folder, choose and load the backend, build the task, warm up (blocking: call from a
        thread at start-up; ``/ready`` answers 200 only after it). A Hub id is first resolved to its cached
        snapshot (fetched when missing and the Hub is reachable)."""
        refuse_device_list(spec)
        source = resolve_source(spec)
        spec = source.spec
        info = read_model_info(spec.path, max_length=spec.max_length)
        if info.config.get("auto_map") and not spec.trust_remote_code:
            raise Unsupported(
                f"model {spec.served_name!r}: its config.json names custom Python code (auto_map), which is not "
                "run unless the model's spec sets trust_remote_code: true"
            )
        task_name = detect_task(info) if spec.task == "auto" else spec.task
        choice = choose(spec, head=task_class(task_name).head, cache_dir=settings.cache_dir,
                        auto_export=settings.auto_export, threads=spec.threads or settings.threads)
        if choice.dtype is not None:  # chosen for a spec that named none: served and shown as such
            spec = spec.model_copy(update={"dtype": choice.dtype})
        log.info("model %s: backend %s (%s)", spec.served_name, choice.backend, choice.reason)
        backend = create_backend(spec, choice)
        # a static-shape backend (Neuron buckets) caps the length the tokenizer truncates/refuses at
        limit = backend.max_sequence_length
        if limit and info.max_length > limit:
            info = dataclasses.replace(info, max_length=limit)
        task = create_task(task_name, info, spec)
        check_chunking_default(task, spec)
        task.check_backend(backend)
        backend.load(spec.path, head=task.head, device=spec.device, dtype=spec.dtype,
                     threads=spec.threads or settings.threads)
        engine = cls(spec, task, backend, settings=settings, metrics=metrics, model_sha=source.sha, tracer=tracer)
        engine.choice = choice
        if warm_up:
            engine.warm_up()
        return engine

    def warm_up(self) -> list[tuple[int, ...]]:
        """One batch of every shape class the batcher forms (``Task.warmup_batches``: per length bucket up
        to the model's maximum, as many items as the token budget lets in; per modality for multi-modal
        models), run through the backend before the model serves, so the first request pays no first-run
        cost (allocator growth, kernel selection, lazy initialisation). Returns the input shapes run."""
        started = time.monotonic()
        shapes = []
        try:
            batches = self.task.warmup_batches(self.spec.batch_tokens, self.max_batch_size)
        except (TesseraError, RuntimeError, ValueError, OSError) as exc:
            log.warning("model %s: no warm-up (%s: %s)", self.name, type(exc).__name__, exc)
            batches = []
        for inputs in batches:
            shape = tuple(next(iter(inputs.values())).shape)
            try:
                self.backend.run(inputs)
            except (OutOfMemory, MemoryError) as exc:  # served in halves, as any batch out of memory is
                log.warning("model %s: warm-up batch %s ran out of memory: %s", self.name, shape, exc)
                continue
            except (TesseraError, RuntimeError, ValueError, TypeError, IndexError) as exc:
                # every request would fail the same way (IndexError: ids past the model's embeddings, a
                # tokenizer that does not match the weights): the model is not served (a failed load)
                raise BackendFailure(f"model {self.name!r}: its warm-up batch {shape} failed, so every request "
                                     f"would: {type(exc).__name__}: {exc}") from exc
            shapes.append(shape)
        if shapes:
            log.info("model %s: warmed up on %d batch shapes in %.2fs", self.name, len(shapes), time.monotonic() - started)
        return shapes

    # serving ---------------------------------------------------------------------------------
    async def __call__(self, request: Any, *, deadline: float | None = None) -> Any:
        """fetch (event loop, media URLs) → prepare (worker thread) → batch (inference thread) → finish."""
        tracer = self.tracer
        if self.task.fetches_inputs:
            with tracer.span("media.fetch", {"tessera.model": self.name}):
                await self.task.fetch_inputs(request)
        with tracer.span("tokenize", {"tessera.model": self.name}) as span:
            if self.task.prepare_inline(request):  # cheaper than a thread hop: tokenize a few short texts on the loop
                items = self.task.prepare(request)
            else:
                items = await self._prep(request)
            costs = [it.cost for it in items]
            if span is not None:
                span.set_attribute("tessera.inputs", len(items))
                span.set_attribute("tessera.tokens", sum(costs))
        group = self.task.batch_group(request)
        note_work(self.name, len(items), sum(costs))
        if sum(costs) > self.max_tokens_per_request:
            raise TooLarge(f"the request holds {sum(costs)} tokens; the limit is {self.max_tokens_per_request}",
                           code="too_many_tokens")
        self._check_answer_size(request, items)
        results = await self.batcher.submit(items, costs=costs, deadline=deadline, group=group)
        return self.task.finish(request, items, results)

    #: the fewest bytes a value of a per-token answer takes as a JSON number (digits, sign, point,
    #: separator; counted low, so that no answer that fits is refused)
    ANSWER_VALUE_BYTES = 8

    def _check_answer_size(self, request: Any, items: list) -> None:
        """An answer that grows with the tokens (a vector per token) is refused before any inference when
        it cannot fit ``max_response_bytes``."""
        values = self.task.answer_values(request, items)
        if values is None:
            return
        least = values * self.ANSWER_VALUE_BYTES
        if least > self.task.limits.response_bytes:
            raise TooLarge(f"the answer would hold {values} values (a vector per token), at least {least} bytes; the "
                           f"limit is {self.task.limits.response_bytes} (max_response_bytes): send fewer or shorter "
                           "inputs", code="response_too_large")

    def run_sync(self, request: Any) -> Any:
        """The same path without the batcher (benchmarks and parity tests: the in-process reference)."""
        items = self.task.prepare(request)
        return self.task.finish(request, items, self._run_batch(items))

    def _run_batch(self, items: list) -> list:
        """One batch through collate → backend → postprocess; out of memory, the batch is retried in
        halves (down to single items, which then fail alone)."""
        try:
            inputs = self.task.collate(items)
            outputs = self.backend.run(inputs)
        except (OutOfMemory, MemoryError) as exc:
            if len(items) == 1:
                raise OutOfMemory(f"out of memory on a single item: {exc}") from exc
            log.warning("out of memory on a batch of %d on %s: retrying in halves", len(items), self.name)
            half = len(items) // 2
            return self._run_batch(items[:half]) + self._run_batch(items[half:])
        return self.task.postprocess(outputs, items)

    # health ----------------------------------------------------------------------------------
    def _on_batch(self, stats: BatchStats) -> None:
        if self.metrics is not None:
            self.metrics.observe_batch(self.name, stats, self.batcher.depth)

    def _on_drop(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.count_drop(self.name, reason)

    def _on_error(self, exc: BaseException) -> None:
        if self.metrics is not None:
            self.metrics.count_batch_failure(self.name)
        self.consecutive_failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"

    def _on_success(self) -> None:
        self.consecutive_failures = 0

    @property
    def healthy(self) -> bool:
        return self.consecutive_failures < UNHEALTHY_AFTER

    def describe(self) -> dict:
        """What this engine is: its modalities, then what the task and the backend describe (the API's
        model cards wrap this in their wire format); ``model_sha``: the Hub commit served (None: a folder)."""
        return {"model_sha": self.model_sha, "modalities": list(self.task.modalities), **self.task.describe(),
                **self.backend.describe(), "backend_reason": self.choice.reason}

    async def start(self) -> None:
        await self.batcher.start()

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        await self.batcher.stop(drain=drain, timeout=timeout)
        self._prep.shutdown()


@dataclass
class FailedModel:
    spec: ModelSpec
    error: str


@dataclass
class Registry:
    engines: dict[str, Engine] = field(default_factory=dict)
    failed: dict[str, FailedModel] = field(default_factory=dict)
    #: settings.allow_degraded: serve (and report ready) with the models that loaded when others failed
    allow_degraded: bool = False
    #: the event loop the batchers were started in by ``ensure_started`` (None: not started that way)
    _loop: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics | None = None,
                      tracer: NoTracer | OtelTracer = NO_TRACER, *, warm_up: bool = True) -> "Registry":
        """Load every configured model. A model that fails to load is recorded in ``failed``, and the others
        still load; whether that may serve is :meth:`raise_if_unusable`'s rule. ``warm_up=False`` leaves the
        warm-up to the caller (:meth:`warm_up`), or skips it (Lambda's on-demand init)."""
        registry = cls(allow_degraded=settings.allow_degraded)
        set_parallelism(settings.tokenizer_parallelism)
        specs = settings.model_specs()
        problems = [problem for spec in specs if (problem := device_list_problem(spec)) is not None]
        if problems:
            raise ConfigError(problems)
        for index, spec in enumerate(specs, 1):
            started = time.monotonic()
            log.info("loading model %d/%d: %s (%s)", index, len(specs), spec.served_name, spec.path)
            try:
                engine = Engine.load(spec, settings, metrics, tracer=tracer, warm_up=warm_up)
            except TesseraError as exc:
                log.error("model %s failed to load: %s", spec.served_name, exc.message)
                registry.failed[spec.served_name] = FailedModel(spec, exc.message)
                continue
            except (OSError, ValueError, RuntimeError, ImportError) as exc:
                log.exception("model %s failed to load", spec.served_name)
                registry.failed[spec.served_name] = FailedModel(spec, f"{type(exc).__name__}: {exc}")
                continue
            log.info("loaded model %d/%d: %s (%s) in %.1fs", index, len(specs), spec.served_name,
                     _fields(engine.backend.describe()), time.monotonic() - started)
            registry.engines[spec.served_name] = engine
        if metrics is not None:
            for name in registry.failed:
                metrics.model_load_failures.labels(name).inc()
            metrics.models_loaded.set(len(registry.engines))
        return registry

    def warm_up(self) -> None:
        """Run every engine's warm-up (:meth:`Engine.warm_up`); an engine whose warm-up fails is moved to
        ``failed``, as a model that failed to load (:meth:`raise_if_unusable` then applies)."""
        for name, engine in list(self.engines.items()):
            try:
                engine.warm_up()
            except TesseraError as exc:
                log.error("model %s failed to load: %s", name, exc.message)
                self.failed[name] = FailedModel(engine.spec, exc.message)
                del self.engines[name]

    def move_to(self, device: str | None = None, *, settings: Settings,
                specs: "dict[str, ModelSpec] | None" = None) -> "Registry":
        """A registry of these models on ``device``, their loaded weights moved there in place
        (``Backend.to_device``: weights loaded on the CPU before a memory snapshot go to the GPU after
        restore), each engine built again around the moved backend with the spec it now serves, so its batch
        budget is the device's. ``specs``: instead of ``device``, the spec each model serves after the move,
        by served name (its device and dtype are where and how the weights go); models it does not name are
        left out. A model whose backend cannot move (ONNX Runtime, CTranslate2, Neuron: ``Unsupported``) or
        whose move is refused is recorded in ``failed``; a failed model stays failed. Call it before the
        batchers start."""
        if (device is None) == (specs is None):
            raise ValueError("move_to: give a device or the specs to serve, not both")
        targets = specs if specs is not None else {
            name: model.spec.model_copy(update={"device": device})
            for name, model in [*self.engines.items(), *self.failed.items()]}
        moved = Registry(allow_degraded=self.allow_degraded)
        for name, spec in targets.items():
            if name in self.failed:
                moved.failed[name] = FailedModel(spec, self.failed[name].error)
                continue
            if name not in self.engines:
                raise KeyError(f"move_to: no model {name!r} in this registry")
            engine = self.engines[name]
            try:
                if (engine.spec.device, engine.spec.dtype) != (spec.device, spec.dtype):
                    engine.backend.to_device(spec.device, spec.dtype)
            except TesseraError as exc:
                moved.failed[name] = FailedModel(spec, exc.message)
                continue
            engine._prep.shutdown()
            moved.engines[name] = Engine(spec, engine.task, engine.backend, settings=settings, metrics=engine.metrics,
                                         model_sha=engine.model_sha, tracer=engine.tracer)
        return moved

    def get(self, served_name: str | None, capability: str) -> Engine:
        """The engine serving ``served_name`` (optional when one model fits) that can do ``capability``."""
        if served_name is None or served_name == "":
            if len(self.engines) + len(self.failed) == 1 and self.engines:
                engine = next(iter(self.engines.values()))
            else:
                candidates = [e for e in self.engines.values() if capability in e.task.capabilities]
                if len(candidates) != 1:
                    raise ModelNotFound(
                        f"several models are served; name one in 'model' (one of {sorted(self.engines)}; "
                        "on TEI's routes, which have no 'model' field: ?model=NAME or an X-Model header)",
                        param="model",
                    )
                engine = candidates[0]
        elif served_name in self.engines:
            engine = self.engines[served_name]
        elif served_name in self.failed:
            raise NotReady(f"model {served_name!r} failed to load: {self.failed[served_name].error}")
        else:
            raise ModelNotFound(
                f"model {served_name!r} not found; served models: {sorted(self.engines)}", param="model"
            )
        if capability not in engine.task.capabilities:
            raise Unsupported(
                f"model {engine.name!r} ({engine.task.name}) cannot serve {capability!r}; "
                f"it serves: {sorted(engine.task.capabilities)}",
                param="model", code="unsupported_task",
            )
        return engine

    def raise_if_unusable(self, allow_degraded: bool | None = None) -> None:
        """The start-up rule every surface applies after loading: ``StartupFailed`` (naming each failure)
        when no model loaded, or when any failed and ``allow_degraded`` (default: the settings') is off."""
        allow = self.allow_degraded if allow_degraded is None else allow_degraded
        reasons = "; ".join(f"{name}: {f.error}" for name, f in self.failed.items())
        if not self.engines:
            raise StartupFailed(f"no model could be loaded ({reasons or 'none configured'})")
        if self.failed and not allow:
            raise StartupFailed(
                f"{len(self.failed)} of {len(self.failed) + len(self.engines)} models failed to load ({reasons}); "
                "set allow_degraded (TESSERA_ALLOW_DEGRADED=true) to serve the others"
            )

    @property
    def ready(self) -> bool:
        return (bool(self.engines) and (self.allow_degraded or not self.failed)
                and all(e.healthy for e in self.engines.values()))

    async def start(self) -> None:
        for engine in self.engines.values():
            await engine.start()

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        for engine in self.engines.values():
            await engine.stop(drain=drain, timeout=timeout)

    async def ensure_started(self) -> None:
        """Start the batchers in the running event loop unless already started there (cheap when started).

        For surfaces without an ASGI lifespan: Lambda runs the app through Mangum with ``lifespan="off"``
        on one long-lived loop, so the batchers start on the first request and persist across
        invocations. Batchers cannot move between loops: a second loop is a programming error."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            raise RuntimeError("the batchers were started in another event loop; they cannot move")
        await self.start()
        self._loop = loop


def device_list_problem(spec: ModelSpec) -> str | None:
    """A spec whose ``device`` lists several devices (``cuda:0,cuda:1``, ``cuda:*``, ``cpu:N``) is served by one
    executor process per device (``core.executor``), never by a model in this process."""
    if not is_device_list(spec.device):
        return None
    return (f"model {spec.served_name!r}: device {spec.device!r} names devices served by executor processes, one per "
            "device; they run when the server has front-end processes (frontends > 1, TESSERA_FRONTENDS), not in a "
            "single-process server: name one device (cpu, cuda, cuda:N) or set frontends")


def refuse_device_list(spec: ModelSpec) -> None:
    problem = device_list_problem(spec)
    if problem is not None:
        raise ConfigError([problem])


def _fields(described) -> str:
    """A backend's description as ``key=value`` pairs (a log line, not a dict's repr)."""
    if not isinstance(described, dict):
        return str(described)
    return " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, (list, tuple)) else v}" for k, v in described.items())
