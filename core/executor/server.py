"""The executor process: one per device. It loads the models of its device with ``Engine.load`` (weights,
warm-up), runs each model's ``Batcher`` and serves the front ends on a Unix domain socket; the items of
every front end meet in one queue per model.

Per connection the front end creates two arenas (``core.executor.shm``): requests (its allocator) and
results (this process's allocator). A ``submit`` names where its items lie; the items are built as numpy
views there (``wire.decode_items``), submitted to the model's batcher, and the results written into the
result arena (``wire.encode_results``); the reply names where, with the model's queue depth. The front end
frees the result block (``free``) once it copied it; its own request block it frees on the reply, which
therefore comes only once no batch reads the items any more. ``cancel`` drops a request's queued items
(its caller went away). Multi-modal and chat-message requests (``whole``) are sent as one object per
request and run through the whole ``Engine.__call__`` here: their items are not token arrays."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import pickle
import signal
import sys
import time
from typing import Any

from core.collector import tune_for_serving
from core.errors import NotReady, Overloaded, TesseraError, Timeout
from core.executor import wire
from core.executor.shm import Allocator, Segment

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``); if the parent is
    already gone (it died before the call), exit now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(1)


def model_report(engine) -> dict:
    """What a front end needs to build the model's task without its weights (``core.executor.client``)."""
    backend = engine.backend
    return {
        "spec": engine.spec.model_dump(mode="json"),
        "task": engine.task.name,
        "max_length": engine.task.info.max_length,
        "choice": {"backend": engine.choice.backend, "reason": engine.choice.reason, "dtype": engine.choice.dtype},
        "model_sha": engine.model_sha,
        "backend": {
            "name": backend.name,
            "describe": backend.describe(),
            "max_batch_size": backend.max_batch_size,
            "max_sequence_length": backend.max_sequence_length,
            "lanes": backend.lanes,
            "masks_attention": backend.masks_attention,
            "default_adapter": backend.default_adapter,
            "served_file": str(getattr(backend, "served_file", None) or "") or None,
        },
    }


class ExecutorServer:
    def __init__(self, engines: dict[str, Any], device: str, metrics=None):
        self.engines = engines
        self.device = device
        #: this process's ``core.metrics.Metrics`` (the batch metrics of its models), answered to ``metrics``
        self.metrics = metrics
        self.connections: set[_Connection] = set()
        self.server: asyncio.AbstractServer | None = None
        self.stopping = asyncio.Event()

    async def serve(self, path: str) -> None:
        for engine in self.engines.values():
            await engine.start()
        self.server = await asyncio.start_unix_server(self._connected, path=path)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    def render_metrics(self) -> bytes:
        """This executor's exposition, with each model's queue depth as of now."""
        if self.metrics is None:
            return b""
        for name, engine in self.engines.items():
            self.metrics.queue_depth.labels(name).set(engine.batcher.depth)
        return self.metrics.render()

    async def drain_and_stop(self, timeout: float) -> None:
        """Take no new connection; serve what the connected front ends send until none has work in flight
        (within ``timeout``: the supervisor drains the front ends first), then refuse more and close."""
        if self.server is not None:
            self.server.close()
        deadline = time.monotonic() + timeout
        while any(conn.tasks for conn in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.accepting = False
        for engine in self.engines.values():
            await engine.stop(drain=True, timeout=max(0.0, deadline - time.monotonic()))
        for conn in list(self.connections):
            conn.close()


class _Connection:
    def __init__(self, server: ExecutorServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader, self.writer = reader, writer
        self.tasks: dict[int, asyncio.Task] = {}
        self.requests: Segment | None = None
        self.results: Segment | None = None
        self.allocator: Allocator | None = None
        self.outbox: wire.Outbox | None = None
        self.accepting = True

    async def run(self) -> None:
        try:
            header, _ = await wire.read_frame(self.reader)
            if header.get("op") == "metrics":  # a front end gathering /metrics (core.executor.metrics)
                wire.write_frame(self.writer, {"op": "metrics"}, self.server.render_metrics())
                await self.writer.drain()
                return
            if header.get("op") != "hello":
                return
            self.requests = Segment.attach(header["requests"])
            self.results = Segment.attach(header["results"])
            self.allocator = Allocator(self.results.size)
            self.outbox = wire.Outbox(self.writer)
            wire.write_frame(self.writer, {"op": "welcome", "device": self.server.device, "pid": os.getpid()})
            while True:
                header, payload = await wire.read_frame(self.reader)
                op = header["op"]
                if op == "submit":
                    self._free(header.get("free"))
                    self._track(header["id"], self._submit(header, payload))
                elif op == "free":
                    self._free(header["free"])
                elif op == "cancel":
                    task = self.tasks.get(header["id"])
                    if task is not None:
                        task.cancel()
                elif op == "whole":
                    self._track(header["id"], self._whole(header, payload))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front end went away
        finally:
            self.close()

    def _track(self, rid: int, work) -> None:
        task = asyncio.create_task(work)
        self.tasks[rid] = task

        def done(task: asyncio.Task) -> None:
            if task.cancelled():  # cancelled before it ran: nothing was queued, the front end still needs a reply
                self.tasks.pop(rid, None)
                self._send({"op": "cancelled", "id": rid})

        task.add_done_callback(done)

    def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        self.tasks.clear()
        if not self.writer.is_closing():
            self.writer.close()
        for segment in (self.requests, self.results):  # the front end is gone: nobody else unlinks them
            if segment is not None:
                segment.unlink()
                segment.close()

    def _free(self, offsets) -> None:
        if offsets:
            for offset in offsets:
                self.allocator.free(offset)

    def _send(self, header: dict, payload=None) -> None:
        if self.outbox is not None and not self.writer.is_closing():
            self.outbox.send(header, payload)

    async def _settle(self, engine) -> None:
        """Wait for the batches running now: a request given up (cancelled, past its deadline) may have items
        in one, reading the request arena, which the front end reuses once it has the reply."""
        running = engine.batcher.running_batches()
        if running:
            await asyncio.wait(running)

    async def _submit(self, header: dict, payload: bytes | None) -> None:
        rid = header["id"]
        engine = self.server.engines.get(header["model"])
        try:
            if engine is None:
                raise NotReady(f"executor {self.server.device} does not serve model {header['model']!r}")
            if not self.accepting:
                raise NotReady(f"executor {self.server.device} is shutting down")
            buf = self.requests.map if payload is None else payload
            offset = header["off"] if payload is None else 0
            items = wire.decode_items(header["items"], header["table"], buf, offset)
            costs = [it.cost for it in items]
            ttl = header.get("ttl")
            deadline = None if ttl is None else time.monotonic() + ttl
            try:
                results = await engine.batcher.submit(items, costs=costs, deadline=deadline, group=header.get("group"))
            except (asyncio.CancelledError, Timeout):
                await asyncio.shield(self._settle(engine))
                raise
            del items
            self._reply_results(rid, engine, results)
        except asyncio.CancelledError:
            self._send({"op": "cancelled", "id": rid})
        except TesseraError as exc:
            self._send(_error_header(rid, exc, engine))
        except Exception as exc:  # decoding or encoding failed: this request only
            log.exception("request %s on executor %s failed", rid, self.server.device)
            self._send({"op": "error", "id": rid, "cls": "BackendFailure",
                        "message": f"executor {self.server.device}: {type(exc).__name__}: {exc}"})
        finally:
            self.tasks.pop(rid, None)

    def _reply_results(self, rid: int, engine, results: list) -> None:
        desc, writer = wire.encode_results(results)
        header = {"op": "done", "id": rid, "n": len(results), "res": desc, "table": writer.table,
                  "depth": engine.batcher.depth, "healthy": engine.healthy}
        offset = self.allocator.alloc(writer.nbytes) if writer.nbytes else None
        if offset is not None:
            writer.write(self.results.map, offset)
            header["off"] = offset
            self._send(header)
        elif writer.nbytes:  # no room in the arena: the payload carries them
            payload = bytearray(writer.nbytes)
            writer.write(payload, 0)
            self._send(header, payload)
        else:
            self._send(header)

    async def _whole(self, header: dict, payload: bytes) -> None:
        rid = header["id"]
        engine = self.server.engines.get(header["model"])
        try:
            if engine is None:
                raise NotReady(f"executor {self.server.device} does not serve model {header['model']!r}")
            request = pickle.loads(payload)
            ttl = header.get("ttl")
            result = await engine(request, deadline=None if ttl is None else time.monotonic() + ttl)
            self._send({"op": "whole_done", "id": rid, "depth": engine.batcher.depth, "healthy": engine.healthy},
                       pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        except asyncio.CancelledError:
            self._send({"op": "cancelled", "id": rid})
        except TesseraError as exc:
            self._send(_error_header(rid, exc, engine))
        except Exception as exc:
            log.exception("request %s on executor %s failed", rid, self.server.device)
            self._send({"op": "error", "id": rid, "cls": "BackendFailure",
                        "message": f"executor {self.server.device}: {type(exc).__name__}: {exc}"})
        finally:
            self.tasks.pop(rid, None)


def _error_header(rid: int, exc: TesseraError, engine) -> dict:
    header = {"op": "error", "id": rid, "cls": type(exc).__name__, "message": exc.message, "param": exc.param,
              "code": exc.code}
    if isinstance(exc, Overloaded) or getattr(exc, "retry_after", None) is not None:
        header["retry_after"] = exc.retry_after
    if engine is not None:
        header["depth"] = engine.batcher.depth
    return header


# ---- the process --------------------------------------------------------------------------------------
def executor_main(settings, device: str, specs: list, socket_path: str, conn, parent_pid: int) -> None:
    """The executor process's entry point (``multiprocessing`` spawn): load, report, serve until SIGTERM."""
    die_with_parent(parent_pid)
    from core.engine import Engine
    from core.tokenization import set_parallelism
    from core.logs import configure_logging
    from core.metrics import Metrics

    configure_logging(settings.log_level, fmt=settings.log_format)
    set_parallelism(settings.tokenizer_parallelism)
    metrics = Metrics()
    engines, failed = {}, {}
    for spec in specs:
        error = _load(Engine, spec, settings, metrics, engines)
        if error is None:
            continue
        log.error("model %s failed to load on %s: %s", spec.served_name, device, error)
        if not settings.allow_degraded:
            conn.send(("failed", spec.served_name, error))
            return
        failed[spec.served_name] = error
    report = {name: model_report(engine) for name, engine in engines.items()}
    asyncio.run(_serve(engines, device, socket_path, conn, report, settings.shutdown_grace_s, metrics, failed))


def _load(engine_class, spec, settings, metrics, engines: dict) -> str | None:
    """Load ``spec`` into ``engines`` (weights and warm-up); None, or why it failed (as ``Registry.from_settings``
    records a failed model: the error's message, or the exception's type and text)."""
    try:
        with metrics.muted():  # the warm-up pass is not the users' work
            engines[spec.served_name] = engine_class.load(spec, settings, metrics)
    except TesseraError as exc:
        return exc.message
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def _serve(engines: dict, device: str, socket_path: str, conn, report: dict, grace: float,
                 metrics=None, failed: dict | None = None) -> None:
    """Serve ``engines``; ``failed``: the models of this device that did not load (``allow_degraded``), by name,
    with why: reported with the others, so that the front ends answer for them as a one-process server does."""
    server = ExecutorServer(engines, device, metrics)
    await server.serve(socket_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    conn.send(("ready", report, failed or {}))
    conn.close()
    log.info("executor %s (pid %d) serves %s%s", device, os.getpid(), ", ".join(engines) or "no model",
             f" ({', '.join(sorted(failed))} failed to load)" if failed else "")
    restore_collector = tune_for_serving()
    try:
        await stop.wait()
        log.info("executor %s: draining", device)
        await server.drain_and_stop(grace)
    finally:
        restore_collector()


# ---- served from a thread of a process that already holds the weights ----------------------------------
class ThreadExecutor:
    """An executor served from a thread of this process, on an event loop of its own, over engines this process
    already holds: Modal's class, whose weights come back with its memory snapshot and must not be read again
    by a child. The same ``ExecutorServer`` as the executor process, on a socket in a private run directory
    with its ``executors.json``; it has what the supervisor asks of an executor set (``address``, ``pids``,
    ``check()``, ``restart()``, ``stop(timeout)``). The batchers run on its loop: :meth:`submit` runs a
    coroutine there (a bulk call that shares their queues with the front ends' requests)."""

    START_TIMEOUT_S = 120.0

    def __init__(self, settings, engines: dict[str, Any], device: str, metrics=None):
        import threading

        self.settings = settings
        self.engines = engines
        self.device = device
        self.metrics = metrics
        self.loop: asyncio.AbstractEventLoop | None = None
        self.run_dir = None
        self.shm_prefix = ""
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._grace = 0.0

    def start(self, settings=None) -> "ThreadExecutor":
        """Serve (the batchers started, the socket listening, ``executors.json`` written) and return; or raise
        ``StartupFailed``. ``settings``: ignored (the supervisor's ``executors(settings)`` call)."""
        import concurrent.futures
        import threading

        from core.errors import StartupFailed
        from core.executor.rundir import executor_socket, new_run_dir, new_shm_prefix, write_address

        self.run_dir = new_run_dir()
        self.shm_prefix = new_shm_prefix()
        socket_path = executor_socket(self.run_dir, self.device)
        self.loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve_thread, args=(socket_path, started),
                                        name=f"tessera-executor-{self.device}", daemon=True)
        self._thread.start()
        try:
            started.result(self.START_TIMEOUT_S)
        except (OSError, RuntimeError, concurrent.futures.TimeoutError) as exc:
            self.stop(0.0)
            raise StartupFailed(f"executor {self.device} (in this process) could not serve: "
                                f"{type(exc).__name__}: {exc}") from exc
        report = {name: model_report(engine) for name, engine in self.engines.items()}
        write_address(self.run_dir, self.shm_prefix, {self.device: {"socket": socket_path, "pid": os.getpid(),
                                                                    "models": report}})
        log.info("executor %s (pid %d, a thread of this process) serves %s", self.device, os.getpid(),
                 ", ".join(self.engines))
        return self

    def _serve_thread(self, socket_path: str, started) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve(socket_path, started))
        except Exception:  # the loop broke: the thread ends, and check() reports it to the supervisor
            log.exception("executor %s (a thread of pid %d) stopped", self.device, os.getpid())

    async def _serve(self, socket_path: str, started) -> None:
        server = ExecutorServer(self.engines, self.device, self.metrics)
        try:
            await server.serve(socket_path)
        except (OSError, RuntimeError) as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        await self._stopping.wait()
        await server.drain_and_stop(self._grace)

    @property
    def address(self) -> str:
        return str(self.run_dir)

    @property
    def pids(self) -> list[int]:
        return [os.getpid()]

    def check(self) -> str | None:
        if self._thread is not None and self._thread.is_alive():
            return None
        return f"executor {self.device} (a thread of pid {os.getpid()}) stopped"

    def restart(self) -> list[str]:
        from core.errors import StartupFailed

        raise StartupFailed(f"executor {self.device} runs in this process (pid {os.getpid()}) and is not restarted: "
                            "the process must be replaced")

    def submit(self, coro):
        """Run ``coro`` on the executor's loop; a ``concurrent.futures.Future`` of its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float) -> None:
        """Drain (the work the front ends sent finishes within ``timeout``), stop the batchers and the thread,
        then remove the run directory and any shared-memory segment of this set left behind."""
        from core.executor.rundir import remove_run

        self._grace = max(0.0, timeout)
        if self._thread is not None and self._thread.is_alive():
            if self._stopping is not None:
                self.loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout + 30.0)
            if self._thread.is_alive():
                log.warning("executor %s (a thread of this process) did not stop within %.1fs", self.device, timeout)
        if self.loop is not None and not self.loop.is_running() and not self.loop.is_closed():
            pending = asyncio.all_tasks(self.loop)  # left by a loop that broke: cancelled, so they close their sockets
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()
        remove_run(self.run_dir, self.shm_prefix)
