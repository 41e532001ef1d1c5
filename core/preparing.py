"""Preparing requests (tokenization) on threads, many requests per hand-over: :class:`Preparers`.

A thread pool's hand-over costs per request: the submit wakes a worker, and its result wakes the event loop
(a write to the loop's self-pipe, a pass of the selector). Here a worker takes every request queued while it
was busy (its share, when other workers sleep), prepares them one after another, and hands all their results
to the event loop at once: one wake-up each way for a group of requests (``scripts/bench_handover.py``, 64
callers, ~5 µs of work each: 9-11 µs of CPU per call against a pool's 36-48). A request alone is prepared and
answered as by a pool; a request cancelled before a worker reaches it is never prepared."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable


class Preparers:
    """``await preparers(request)`` is ``fn(request)`` run on one of ``workers`` threads (started on the first
    call), its exception raised to the caller."""

    def __init__(self, fn: Callable[[Any], Any], *, workers: int, name: str) -> None:
        self._fn = fn
        self._workers = max(1, workers)
        self._name = name
        self._ready = threading.Condition(threading.Lock())
        self._pending: list[tuple[Any, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._closed = False

    async def __call__(self, request: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._ready:
            if self._closed:
                raise RuntimeError(f"{self._name}: shut down")
            if not self._threads:
                self._start()
            self._pending.append((request, future, loop))
            if self._idle:
                self._ready.notify()
        return await future

    def shutdown(self) -> None:
        """Workers stop once the queue is empty (what is queued is still prepared); no wait for them."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _start(self) -> None:
        for i in range(self._workers):
            thread = threading.Thread(target=self._work, name=f"{self._name}_{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _take(self) -> list | None:
        """This worker's share of the queue (all of it when no other worker sleeps); None: shut down."""
        with self._ready:
            while not self._pending:
                if self._closed:
                    return None
                self._idle += 1
                self._ready.wait()
                self._idle -= 1
            pending = self._pending
            share = len(pending) if not self._idle else -(-len(pending) // (self._idle + 1))
            taken, self._pending = pending[:share], pending[share:]
            if self._pending and self._idle:
                self._ready.notify()
            return taken

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            done: dict[asyncio.AbstractEventLoop, list] = {}
            for request, future, loop in taken:
                if future.cancelled():  # its caller went away while it waited: nothing to prepare
                    continue
                try:
                    outcome = (future, True, self._fn(request))
                except BaseException as exc:  # noqa: BLE001 - the caller's to raise, as a pool's future would
                    outcome = (future, False, exc)
                done.setdefault(loop, []).append(outcome)
            for loop, outcomes in done.items():
                try:
                    loop.call_soon_threadsafe(_deliver, outcomes)
                except RuntimeError:  # that loop is closed: nobody waits for these any more
                    pass


def _deliver(outcomes: list) -> None:
    """On the event loop: each result (or exception) to its caller, unless the caller went away."""
    for future, ok, value in outcomes:
        if future.done():
            continue
        if ok:
            future.set_result(value)
        elif isinstance(value, StopIteration):  # a future refuses it (it would end a generator instead)
            future.set_exception(RuntimeError(f"preparing raised {value!r}"))
        else:
            future.set_exception(value)
