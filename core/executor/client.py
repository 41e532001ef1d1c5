"""The front end's side: ``remote_registry`` builds a ``Registry`` whose engines hold each model's task (its
tokenizer and configuration, never its weights) and send their items to the executors.

A ``RemoteEngine`` is an ``Engine`` whose backend is a description of the executor's (``RemoteBackend``:
what ``/v1/models`` shows, the limits the task checks) and whose batcher is a ``RemoteBatcher``: ``submit``
writes the items into this front end's request arena, sends the header to the executor with the least queued
work for the model (the items this front end has outstanding there plus the queue depth the executor
reported in its last reply) and returns the results read back from the result arena. The serving layer,
``Task.prepare`` and ``Task.finish`` run here unchanged.

An executor that goes away fails the requests in flight on it with ``BackendFailure`` naming it; the models
it serves report unhealthy (``Registry.ready`` false) until the link reconnects, which it tries every
``RECONNECT_S`` (the supervisor restarts the executor on the same socket)."""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from core import errors
from core.backends.registry import Choice
from core.config import ModelSpec, Settings
from core.engine import UNHEALTHY_AFTER, Engine, Registry
from core.errors import BackendFailure, NotReady, StartupFailed, TesseraError
from core.executor import wire
from core.executor.rundir import ADDRESS_FILE
from core.executor.shm import Allocator, Segment
from core.loading import read_model_info
from core.metrics import Metrics
from core.tasks import create_task
from core.tasks.chunking import check_default as check_chunking_default
from core.tokenization import set_parallelism
from core.tracing import NO_TRACER, NoTracer, OtelTracer

log = logging.getLogger(__name__)

#: seconds between attempts to reach an executor that went away
RECONNECT_S = 0.2
#: bytes of each arena (requests, results) per connection; a request or answer that does not fit goes inline
REQUEST_ARENA_BYTES = 32 * 1024 * 1024
RESULT_ARENA_BYTES = 64 * 1024 * 1024
#: tasks whose items are not token arrays (images, audio, chat messages): each request runs whole in the
#: executor (sent once, pickled: fetch → prepare → batch → finish there)
WHOLE_TASKS = frozenset({"clip", "clap", "colpali", "vlm_embed"})


class RemoteBackend:
    """The executor's backend as the front end knows it: its description and the limits it declares."""

    def __init__(self, report: dict):
        self.name = report["name"]
        self._describe = report["describe"]
        self.max_batch_size = report["max_batch_size"]
        self.max_sequence_length = report["max_sequence_length"]
        self.lanes = report["lanes"]
        self.masks_attention = report["masks_attention"]
        self.default_adapter = report["default_adapter"]
        self.served_file = report["served_file"]

    def describe(self) -> dict:
        return dict(self._describe)

    def run(self, inputs):
        raise BackendFailure("internal: a front end runs no model; its items go to an executor")


class _Pending:
    __slots__ = ("future", "offset", "model", "items")

    def __init__(self, future: asyncio.Future, offset: int | None, model: str, items: int):
        self.future, self.offset, self.model, self.items = future, offset, model, items


class ExecutorLink:
    """This front end's connection to one executor: the socket, the two arenas, the requests in flight."""

    def __init__(self, device: str, socket: str, shm_prefix: str, pid: int | None = None):
        self.device = device
        self.socket = socket
        self.shm_prefix = shm_prefix
        self.pid = pid
        self.connected = False
        self.closing = False
        #: model → items this front end has in flight there; model → queue depth it reported last
        self.outstanding: dict[str, int] = {}
        self.depth: dict[str, int] = {}
        self.healthy: dict[str, bool] = {}
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._frees: list[int] = []
        self._outbox: wire.Outbox | None = None
        self._reader_task: asyncio.Task | None = None
        self._reconnect_task: asyncio.Task | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._requests: Segment | None = None
        self._results: Segment | None = None
        self._allocator: Allocator | None = None
        self.last_error: str | None = None
        #: engines using this link (it closes when the last one stops)
        self.users = 0
        #: model → requests sent on this link (the balance across executors, read by tests and benchmarks)
        self.sent: dict[str, int] = {}

    def load(self, model: str) -> int:
        return self.outstanding.get(model, 0) + self.depth.get(model, 0)

    # connection ---------------------------------------------------------------------------------------
    async def connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.socket)
        try:
            requests = Segment.create(self.shm_prefix, REQUEST_ARENA_BYTES)
            try:
                results = Segment.create(self.shm_prefix, RESULT_ARENA_BYTES)
            except OSError:
                requests.unlink()
                raise
        except OSError:
            writer.close()
            raise
        try:
            wire.write_frame(writer, {"op": "hello", "requests": requests.name, "results": results.name})
            welcome, _ = await wire.read_frame(reader)
        except (OSError, asyncio.IncompleteReadError) as exc:
            writer.close()
            for segment in (requests, results):
                segment.unlink()
                segment.close()
            raise ConnectionError(f"executor {self.device} refused the connection: {exc}") from exc
        # the executor has mapped both (it attaches before its welcome): the names are no longer needed, and
        # a segment without a name is freed by the kernel when the last process mapping it exits, SIGKILL too
        for segment in (requests, results):
            segment.unlink()
        self.pid = welcome.get("pid", self.pid)
        self._requests, self._results = requests, results
        self._allocator = Allocator(requests.size)
        self._writer = writer
        self._outbox = wire.Outbox(writer, before_flush=self._flush_frees)
        self._frees = []
        self.depth.clear()
        self.connected = True
        self.last_error = None
        self._reader_task = asyncio.create_task(self._read(reader), name=f"executor-{self.device}")

    async def start(self) -> None:
        try:
            await self.connect()
        except (OSError, ConnectionError) as exc:
            self.last_error = f"executor {self.device} is not reachable: {exc}"
            log.warning("%s; retrying", self.last_error)
            self._reconnect_later()

    def _reconnect_later(self) -> None:
        if self.closing or (self._reconnect_task is not None and not self._reconnect_task.done()):
            return
        self._reconnect_task = asyncio.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        while not self.closing and not self.connected:
            await asyncio.sleep(RECONNECT_S)
            try:
                await self.connect()
            except (OSError, ConnectionError):
                continue
            log.info("executor %s (pid %s) is back", self.device, self.pid)

    async def close(self) -> None:
        self.closing = True
        for task in (self._reconnect_task, self._reader_task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._lost(f"executor {self.device}: the front end is shutting down", NotReady, quiet=True)

    def _lost(self, why: str, error=BackendFailure, *, quiet: bool = False) -> None:
        """The connection is gone: fail what was in flight on it, drop the arenas."""
        was = self.connected
        self.connected = False
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(error(why))
        self.outstanding.clear()
        for segment in (self._requests, self._results):
            if segment is not None:
                segment.unlink()
                segment.close()
        self._requests = self._results = None
        if was:
            self.last_error = why
        if was and not quiet:
            log.error("%s (%d requests in flight failed)", why, len(pending))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header, payload = await wire.read_frame(reader)
                self._reply(header, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            self._lost(f"executor {self.device} (pid {self.pid}) went away: its requests in flight failed")
            self._reconnect_later()

    # requests -----------------------------------------------------------------------------------------
    def _reply(self, header: dict, payload: bytes | None) -> None:
        p = self._pending.pop(header["id"], None)
        if p is None:
            return
        if p.offset is not None:
            self._allocator.free(p.offset)
        self.outstanding[p.model] -= p.items
        if "depth" in header:
            self.depth[p.model] = header["depth"]
        if "healthy" in header:
            self.healthy[p.model] = header["healthy"]
        op = header["op"]
        if op == "error":
            result = _error(header, self.device)
        elif op in ("done", "whole_done"):
            try:
                result = self._results_of(header, payload) if op == "done" else pickle.loads(payload)
            except (TesseraError, ValueError, TypeError, KeyError, pickle.UnpicklingError) as exc:  # this request only
                log.exception("the answer of executor %s could not be read", self.device)
                result = BackendFailure(f"executor {self.device}: its answer could not be read: "
                                        f"{type(exc).__name__}: {exc}")
        else:  # cancelled
            result = NotReady(f"executor {self.device} dropped the request")
        if p.future.done():
            return
        if isinstance(result, BaseException):
            p.future.set_exception(result)
        else:
            p.future.set_result(result)

    def _results_of(self, header: dict, payload: bytes | None) -> list:
        table = header["table"]
        if payload is not None:
            return wire.decode_results(header["res"], header["n"], table, bytearray(payload), 0)
        offset = header.get("off")
        if offset is None:
            return wire.decode_results(header["res"], header["n"], table, b"", 0)
        nbytes = sum(wire.padded(np.dtype(d).itemsize * c) for d, c in table)
        private = np.empty(nbytes, dtype=np.uint8)  # one copy out of the arena, then the block is free again
        private[:] = np.frombuffer(self._results.map, np.uint8, nbytes, offset)
        self._free_result(offset)
        return wire.decode_results(header["res"], header["n"], table, private, 0)

    def _free_result(self, offset: int) -> None:
        self._frees.append(offset)
        self._outbox.schedule()

    def _flush_frees(self) -> None:
        """The result blocks copied out since the last write go back with it, in one ``free`` frame."""
        if self._frees:
            frees, self._frees = self._frees, []
            self._outbox.parts += wire.frame({"op": "free", "free": frees})

    def _new_request(self, model: str, items: int, offset: int | None) -> tuple[int, asyncio.Future]:
        self._next_id += 1
        future = self._outbox.loop.create_future()  # a request goes out when connected: the outbox is its link's
        self._pending[self._next_id] = _Pending(future, offset, model, items)
        self.outstanding[model] = self.outstanding.get(model, 0) + items
        self.sent[model] = self.sent.get(model, 0) + 1
        return self._next_id, future

    async def _await(self, rid: int, future: asyncio.Future):
        try:
            return await future
        except asyncio.CancelledError:
            if self.connected and rid in self._pending:  # the caller went away: drop its items there
                self._outbox.send({"op": "cancel", "id": rid})
            raise

    async def submit(self, model: str, items: Sequence[Any], deadline: float | None, group: Any) -> list:
        if not self.connected:
            raise NotReady(self.last_error or f"executor {self.device} is not connected", retry_after=1)
        layout, writer, _ = wire.encode_items(items)
        offset = self._allocator.alloc(writer.nbytes)
        header = {"op": "submit", "model": model, "items": layout, "table": writer.table, "group": group}
        payload = None
        if offset is None:  # no room in the arena: the frame carries the items
            payload = bytearray(writer.nbytes)
            writer.write(payload, 0)
        else:
            writer.write(self._requests.map, offset)
            header["off"] = offset
        if deadline is not None:
            header["ttl"] = deadline - time.monotonic()
        rid, future = self._new_request(model, len(items), offset)
        header["id"] = rid
        self._outbox.send(header, payload)
        return await self._await(rid, future)

    async def whole(self, model: str, request: Any, deadline: float | None) -> Any:
        if not self.connected:
            raise NotReady(self.last_error or f"executor {self.device} is not connected", retry_after=1)
        rid, future = self._new_request(model, 1, None)
        header = {"op": "whole", "id": rid, "model": model}
        if deadline is not None:
            header["ttl"] = deadline - time.monotonic()
        self._outbox.send(header, pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
        return await self._await(rid, future)


def _error(header: dict, device: str) -> TesseraError:
    """The executor's error as the same class (429 keeps its retry-after, a failure names the executor)."""
    cls = getattr(errors, header.get("cls", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, TesseraError)):
        cls = BackendFailure
    message = header["message"]
    if issubclass(cls, (BackendFailure, NotReady)) and "executor" not in message:
        message = f"executor {device}: {message}"
    if cls is errors.Overloaded:
        return errors.Overloaded(message, retry_after=header.get("retry_after", 1))
    try:
        exc = cls(message, param=header.get("param"), code=header.get("code"))
    except TypeError:
        exc = BackendFailure(message)
    if header.get("retry_after") is not None and hasattr(exc, "retry_after"):
        exc.retry_after = header["retry_after"]
    return exc


class RemoteBatcher:
    """The batcher's ``submit`` for a model served by executors: balanced by queued work."""

    def __init__(self, name: str, links: list[ExecutorLink]):
        self.name = name
        self.links = links

    def pick(self) -> ExecutorLink:
        live = [link for link in self.links if link.connected]
        if not live:
            why = "; ".join(link.last_error or f"executor {link.device} is not connected" for link in self.links)
            raise NotReady(f"model {self.name!r}: no executor serving it is reachable ({why})", retry_after=1)
        return min(live, key=lambda link: link.load(self.name)) if len(live) > 1 else live[0]

    async def submit(self, items: Sequence[Any], *, costs: Sequence[int], deadline: float | None = None,
                     group: Any = None) -> list:
        if not items:
            return []
        return await self.pick().submit(self.name, items, deadline, group)

    @property
    def depth(self) -> int:
        return sum(link.load(self.name) for link in self.links)

    def running_batches(self) -> list:
        return []

    async def start(self) -> None:
        for link in self.links:
            if not link.connected and not link.closing and link._reconnect_task is None:
                await link.start()

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while drain and any(link.outstanding.get(self.name) for link in self.links if link.connected):
            if deadline is not None and time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)


class RemoteEngine(Engine):
    """An engine whose task runs here and whose items run in the executors (``RemoteBatcher``)."""

    def __init__(self, spec: ModelSpec, task, backend: RemoteBackend, *, settings: Settings, links: list[ExecutorLink],
                 metrics: Metrics | None = None, model_sha: str | None = None,
                 tracer: NoTracer | OtelTracer = NO_TRACER):
        super().__init__(spec, task, backend, settings=settings, metrics=metrics, model_sha=model_sha, tracer=tracer)
        self.links = links
        self.batcher = RemoteBatcher(self.name, links)
        self.whole = task.name in WHOLE_TASKS
        for link in links:
            link.users += 1

    async def __call__(self, request: Any, *, deadline: float | None = None) -> Any:
        if not self.whole:
            return await super().__call__(request, deadline=deadline)
        if self.task.fetches_inputs:  # media URLs fetched here, under this front end's guard; the bytes travel
            await self.task.fetch_inputs(request)
        return await self.batcher.pick().whole(self.name, request, deadline)

    def describe(self) -> dict:
        """The engine's description, with the devices of the executors that serve it."""
        return {**super().describe(), "executors": [link.device for link in self.links]}

    @property
    def healthy(self) -> bool:
        return (self.consecutive_failures < UNHEALTHY_AFTER
                and all(link.connected and link.healthy.get(self.name, True) for link in self.links))

    @property
    def last_error(self) -> str | None:
        for link in self.links:
            if not link.connected:
                return link.last_error
        return self._last_error

    @last_error.setter
    def last_error(self, value: str | None) -> None:
        self._last_error = value

    def run_sync(self, request: Any) -> Any:
        raise BackendFailure("internal: run_sync needs the model in this process")

    async def start(self) -> None:
        await self.batcher.start()

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        await self.batcher.stop(drain=drain, timeout=timeout)
        for link in self.links:
            link.users -= 1
            if link.users <= 0 and not link.closing:
                await link.close()
        self._prep.shutdown()


def read_address(address: str) -> dict:
    path = Path(address) / ADDRESS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StartupFailed(f"no executor set at {address}: {exc}") from exc


def remote_registry(settings: Settings, address: str, *, metrics: Metrics | None = None,
                    tracer: NoTracer | OtelTracer = NO_TRACER) -> Registry:
    """The models the executors at ``address`` (``ExecutorSet.address``) serve, as a ``Registry`` for this
    front end: each model's task built here from its folder and what the executor reports (the backend it
    chose, its dtype and limits; no backend is created, no weight read); the links connect when the registry
    starts (``Registry.start``, in the app's lifespan)."""
    set_parallelism(settings.tokenizer_parallelism)
    described = read_address(address)
    prefix = described["shm_prefix"]
    links = {device: ExecutorLink(device, entry["socket"], prefix, entry.get("pid"))
             for device, entry in described["executors"].items()}
    models: dict[str, tuple[dict, list[ExecutorLink]]] = {}
    for device, entry in described["executors"].items():
        for name, report in entry["models"].items():
            if name in models:
                models[name][1].append(links[device])
            else:
                models[name] = (report, [links[device]])
    registry = Registry(allow_degraded=settings.allow_degraded)
    for name, (report, model_links) in models.items():
        registry.engines[name] = _remote_engine(settings, report, model_links, metrics, tracer)
    # why a model is not served: it failed to load on its executor (allow_degraded), with the device
    errors = {name: f"{error} (on {device})" for device, entry in described["executors"].items()
              for name, error in entry.get("failed", {}).items()}
    for spec in settings.model_specs():
        if spec.served_name not in registry.engines:
            registry.failed[spec.served_name] = _failed(spec, errors.get(spec.served_name, "no executor serves it"))
    return registry


def _failed(spec, why: str):
    from core.engine import FailedModel

    return FailedModel(spec, why)


def _remote_engine(settings: Settings, report: dict, links: list[ExecutorLink], metrics, tracer) -> RemoteEngine:
    import dataclasses

    spec = ModelSpec.model_validate(report["spec"])
    backend = RemoteBackend(report["backend"])
    info = read_model_info(spec.path, max_length=spec.max_length)
    if report["max_length"] != info.max_length:  # a static-shape backend's cap, as Engine.load applies it
        info = dataclasses.replace(info, max_length=report["max_length"])
    task = create_task(report["task"], info, spec)
    check_chunking_default(task, spec)
    task.check_backend(backend)
    engine = RemoteEngine(spec, task, backend, settings=settings, links=links, metrics=metrics,
                          model_sha=report["model_sha"], tracer=tracer)
    choice = report["choice"]
    engine.choice = Choice(choice["backend"], choice["reason"], dtype=choice.get("dtype"))
    return engine
