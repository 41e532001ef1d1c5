"""Dynamic batching by token budget.

- Runs at once when idle (no fixed wait window); while the backend is busy, new work coalesces.
- A batch is bounded by ``max_batch_tokens`` *padded* tokens (items × longest item) and
  ``max_batch_size`` items.
- Length-aware: from the oldest ``window`` queued items, sorted by length, the batch that holds the
  oldest item is run, so similar lengths share a batch (less padding) and nobody starves.
- Bounded queue: more than ``max_queue_items`` queued items → ``Overloaded`` (429).
- Work whose deadline passed, or whose caller went away (cancelled), is dropped before inference.
- One request's items may span several batches; its result is assembled in order.
- A failing batch fails only the requests that had items in it.

The batch function runs on a dedicated thread, so the event loop stays free; except a batch whose run is
expected to take under ``inline_below_s`` (from the runs of batches of its padded size), which runs on the
event loop itself: handing a batch to a thread and its result back costs the process more CPU than such a
batch takes (the waking of two threads and the hand-over of the interpreter lock each way).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from bisect import bisect_left, bisect_right
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Callable, Mapping, Sequence

from core.errors import BackendFailure, NotReady, Overloaded, TesseraError, Timeout
from core.tracing import NO_TRACER

log = logging.getLogger(__name__)

BatchFn = Callable[[list[Any]], list[Any]]

#: "no group chosen yet" (None is a group: the default one)
_NO_GROUP = object()

#: padding (tokens) an item may add to a batch beyond its own length before it waits for a better batch
PAD_SLACK = 32


@dataclass(eq=False, slots=True)
class _Request:
    future: asyncio.Future
    results: list
    remaining: int
    deadline: float | None
    enqueued: float
    cancelled: bool = False
    #: its items still in the queue
    queued: int = 0
    #: tracing on: the caller's trace context and enqueue time (wall clock, ns); queue span recorded yet
    trace: Any = None
    enqueued_ns: int = 0
    queue_traced: bool = False

    def done(self) -> bool:
        return self.cancelled or self.future.done()


@dataclass(slots=True)
class _Slot:
    request: _Request
    index: int
    item: Any
    cost: int
    group: Any = None  # batches hold one group only (e.g. one modality of a multi-modal model)


@dataclass
class BatchStats:
    """What the batcher reports per batch (hooked to metrics by the engine)."""

    size: int
    tokens: int
    padded_tokens: int
    queue_seconds: list[float] = field(default_factory=list)
    run_seconds: float = 0.0


class Batcher:
    def __init__(
        self,
        fn: BatchFn,
        *,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queue_items: int,
        retry_after_s: int = 1,
        window: int | None = None,
        workers: int = 1,
        name: str = "model",
        on_batch: Callable[[BatchStats], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_success: Callable[[], None] | None = None,
        on_drop: Callable[[str], None] | None = None,
        tracer: Any = NO_TRACER,
        span_attributes: Mapping[str, Any] | None = None,
        inline_below_s: float = 0.0,
    ):
        self._fn = fn
        self.inline_below_s = inline_below_s
        #: seconds a batch ran (its thread's CPU time), by its padded tokens' size class (their bit length):
        #: a running average
        self._run_s: dict[int, float] = {}
        #: batches of a size class that held the loop far too long (see ``HELD_TOO_LONG``)
        self._strikes: dict[int, int] = {}
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue_items = max_queue_items
        self.retry_after_s = retry_after_s
        self.window = window or max_batch_size * 4
        self.workers = workers
        self.name = name
        self._on_batch = on_batch
        self._on_error = on_error
        self._on_success = on_success
        self._on_drop = on_drop
        #: core.tracing: queue and batch spans into each request's trace (NO_TRACER: nothing, no cost)
        self._tracer = tracer
        self._span_attributes = dict(span_attributes or {})
        self._queue: list[_Slot] = []
        self._dead = 0  # queued items of cancelled requests, not yet walked past (``_take`` drops them)
        self._running: set[asyncio.Task] = set()
        self._active = 0  # batches dispatched and not yet finished
        #: per thread, whether the batch it is running should share threads (``should_share_threads``)
        self._sharing = threading.local()
        self._free: asyncio.Semaphore | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        # the loop it was started on, kept: on Python 3.11 asyncio.get_running_loop() (and create_task, which
        # calls it) makes a getpid() system call, per request in submit and per batch in the loop
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._accepting = False

    # lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            return
        self._event_loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"infer-{self.name}")
        self._free = asyncio.Semaphore(self.workers)
        self._active = 0
        self._accepting = True
        self._task = self._event_loop.create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        self._accepting = False
        if self._task is None:
            return
        if drain:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._queue or self._busy:
                if deadline is not None and time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
        self._task.cancel()
        for task in list(self._running):
            task.cancel()
        for task in [self._task, *self._running]:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._task = None
        for slot in self._queue:
            if not slot.request.future.done():
                slot.request.future.set_exception(NotReady("server is shutting down"))
        self._queue.clear()
        self._dead = 0
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def depth(self) -> int:
        """Items queued for a batch (a cancelled request's no longer count)."""
        return len(self._queue) - self._dead

    def should_share_threads(self) -> bool:
        """Asked by the backend as a batch starts, on the thread that runs it: should the batch leave threads for
        other work rather than take every thread? The batcher decides as the batch starts (``_shares``)."""
        return getattr(self._sharing, "share", False)

    def _shares(self, padded_tokens: int) -> bool:
        """Whether a batch starting now should share threads: only with work queued behind it, and then when
        enough is queued for another full batch (the loop starts that one at once on a free worker, beside this
        one) or when batches of its size are cheap (they have run in under ``inline_below_s``: more threads cost
        such a batch more in wake-ups and spinning than they save, while requests wait). A partial batch behind a
        batch that is not cheap waits for it to end (``_loop``), so that batch is alone and takes every thread.
        With one worker no batch runs beside another: nothing to share (and no walk of the queue per batch)."""
        if self.workers == 1 or self.depth == 0:
            return False
        return self._full_batch_queued() or self._quick(padded_tokens.bit_length())

    def running_batches(self) -> list[asyncio.Task]:
        """The batches running now (their items are still read until these end)."""
        return list(self._running)

    @property
    def _busy(self) -> bool:
        return self._active > 0

    # submit ----------------------------------------------------------------------------------
    async def submit(
        self, items: Sequence[Any], *, costs: Sequence[int], deadline: float | None = None, group: Any = None
    ) -> list:
        """Queue ``items`` (with their token ``costs``); return their results in order. Items of different
        ``group`` keys never share a batch."""
        if not self._accepting:
            raise NotReady("server is not accepting work (starting or shutting down)")
        n = len(items)
        if n == 0:
            return []
        if self.depth + n > self.max_queue_items:
            raise Overloaded(
                f"model {self.name!r} is overloaded: {self.depth} items queued "
                f"(limit {self.max_queue_items}); retry later",
                retry_after=self.retry_after_s,
            )
        loop = self._event_loop
        now = time.monotonic()
        req = _Request(loop.create_future(), [None] * n, n, deadline, now, queued=n)
        if self._tracer.enabled:
            req.trace, req.enqueued_ns = self._tracer.context(), time.time_ns()
        self._queue.extend(_Slot(req, i, item, int(c), group) for i, (item, c) in enumerate(zip(items, costs)))
        self._wakeup.set()
        # one timer that fails the request at its deadline (asyncio.wait_for would add a future of its own, two
        # callbacks and a cancellation round trip: ~3 µs more per request)
        timer = None if deadline is None else loop.call_later(max(deadline - now, 0.0), self._expire, req)
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True  # caller went away (client disconnect): drop its queued work
            self._forget(req)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, req: _Request) -> None:
        """The request's deadline passed before it was served: it fails with ``Timeout`` (504), and its items
        still queued stop counting (they are dropped when the queue's head reaches them)."""
        if req.future.done():
            return
        req.cancelled = True
        self._forget(req)
        req.future.set_exception(Timeout("the request's deadline passed before it was served"))

    # loop ------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        """Take a batch whenever a worker is free (work queued meanwhile coalesces into the next batch)."""
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._free.acquire()
            if self._active and not self._full_batch_queued():
                # another batch is running: let a partial batch coalesce until that one ends or it fills
                self._free.release()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._take()
            if not batch:
                self._free.release()
                continue
            self._active += 1
            task = self._event_loop.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[_Slot]) -> None:
        loop = self._event_loop
        stats = BatchStats(
            size=len(batch),
            tokens=sum(s.cost for s in batch),
            padded_tokens=len(batch) * max(s.cost for s in batch),
        )
        now = time.monotonic()
        stats.queue_seconds = [now - s.request.enqueued for s in batch]
        started_ns = time.time_ns() if self._tracer.enabled else 0
        error: BaseException | None = None
        try:
            inline = self._inline(stats.padded_tokens)
            share = self._shares(stats.padded_tokens)
            if inline:
                results, cpu_seconds = self._timed([s.item for s in batch], share)
            else:
                results, cpu_seconds = await loop.run_in_executor(self._executor, self._timed,
                                                                  [s.item for s in batch], share)
            if len(results) != len(batch):
                raise BackendFailure(f"batch returned {len(results)} results for {len(batch)} items")
        except asyncio.CancelledError:
            self._fail(batch, NotReady("server is shutting down"))
            raise
        except TesseraError as exc:
            error = exc
            self._report_error(exc)
            self._fail(batch, exc)
            return
        except Exception as exc:  # a backend/runtime fault: fail this batch's requests only
            log.exception("batch of %d items failed on model %s", len(batch), self.name)
            error = exc
            self._report_error(exc)
            self._fail(batch, BackendFailure(f"inference failed: {type(exc).__name__}: {exc}"))
            return
        finally:
            self._active -= 1
            self._free.release()
            self._wakeup.set()  # the loop may be holding a partial batch back until this one ends
            if started_ns:
                self._trace_batch(batch, stats, started_ns, error)
        stats.run_seconds = time.monotonic() - now
        self._learn(stats.padded_tokens, cpu_seconds, inline_seconds=stats.run_seconds if inline else None)
        if self._on_success:
            self._on_success()
        if self._on_batch:
            self._on_batch(stats)
        for slot, result in zip(batch, results):
            req = slot.request
            if req.future.done():
                continue
            req.results[slot.index] = result
            req.remaining -= 1
            if req.remaining == 0:
                req.future.set_result(req.results)

    def _trace_batch(self, batch: list[_Slot], stats: BatchStats, started_ns: int, error: BaseException | None) -> None:
        """Into the trace of each request with items in this batch: its time in the queue (until its
        first batch started, once) and this batch (size and padded tokens of the whole batch)."""
        ended_ns = time.time_ns()
        attributes = {**self._span_attributes, "tessera.batch.size": stats.size,
                      "tessera.batch.tokens": stats.tokens, "tessera.batch.padded_tokens": stats.padded_tokens}
        counts: dict[_Request, int] = {}
        for slot in batch:
            counts[slot.request] = counts.get(slot.request, 0) + 1
        for req, mine in counts.items():
            if req.trace is None:
                continue
            if not req.queue_traced:
                req.queue_traced = True
                self._tracer.record("queue", req.trace, req.enqueued_ns, started_ns, self._span_attributes)
            self._tracer.record("batch", req.trace, started_ns, ended_ns,
                                {**attributes, "tessera.batch.request_items": mine}, error)

    #: weight of a batch's run in the running average of its size class
    RUN_AVERAGE_WEIGHT = 0.25

    def _timed(self, items: list, share: bool = False) -> tuple[list, float]:
        """The batch function's results, and the CPU time the calling thread spent in it: what the batch would
        hold the event loop for. (Not its wall time: on a thread, that also counts the waits for the
        interpreter lock while the loop holds it, several times the run itself under load.) ``share``: what
        ``should_share_threads`` answers on this thread meanwhile."""
        self._sharing.share = share
        started = time.thread_time()
        try:
            results = self._fn(items)
        finally:
            self._sharing.share = False
        return results, time.thread_time() - started

    #: a batch that held the event loop this many times ``inline_below_s`` (its thread's CPU time said it would
    #: be quick, but it waited: on a device, a sleep, I/O; or the machine gave its core away) is a strike
    #: against its size class, which runs on the thread until its average is under the limit again; after
    #: ``STRIKES`` of them, for good
    HELD_TOO_LONG = 10
    STRIKES = 3

    def _quick(self, size: int) -> bool:
        """Batches of this size class have run in under ``inline_below_s`` on average (a class not yet seen is not)."""
        expected = self._run_s.get(size)
        return expected is not None and expected < self.inline_below_s

    def _inline(self, padded_tokens: int) -> bool:
        """Run on the event loop: batches of this size have run in under ``inline_below_s`` on average (a size
        class not yet seen runs on the thread first)."""
        size = padded_tokens.bit_length()
        return self._quick(size) and self._strikes.get(size, 0) < self.STRIKES

    def _learn(self, padded_tokens: int, seconds: float, *, inline_seconds: float | None = None) -> None:
        """Average in a batch's run: its thread's CPU time on the thread, the time it held the loop on the loop."""
        if self.inline_below_s <= 0:
            return
        size = padded_tokens.bit_length()
        if inline_seconds is not None:  # what it held the loop for (never less than its CPU time)
            seconds = inline_seconds
            if inline_seconds > self.HELD_TOO_LONG * self.inline_below_s:
                self._strikes[size] = strikes = self._strikes.get(size, 0) + 1
                if strikes == self.STRIKES:
                    log.info("model %s: batches of %d padded tokens held the event loop over %.0f ms %d times (the "
                             "last %.1f ms); batches of their size run on the inference thread from now on", self.name,
                             padded_tokens, self.HELD_TOO_LONG * self.inline_below_s * 1000, strikes,
                             inline_seconds * 1000)
        before = self._run_s.get(size)
        self._run_s[size] = seconds if before is None else before + self.RUN_AVERAGE_WEIGHT * (seconds - before)

    def _full_batch_queued(self) -> bool:
        """Enough queued for a full batch (by count or, unpadded, by tokens)?"""
        if len(self._queue) >= self.max_batch_size:
            return True
        return sum(s.cost for s in self._queue) >= self.max_batch_tokens

    def _dropped(self, reason: str) -> None:
        if self._on_drop:
            self._on_drop(reason)

    def _report_error(self, exc: BaseException) -> None:
        if self._on_error:
            self._on_error(exc)

    @staticmethod
    def _fail(batch: list[_Slot], exc: BaseException) -> None:
        for slot in batch:
            if not slot.request.future.done():
                slot.request.future.set_exception(exc)

    def _take(self) -> list[_Slot]:
        """Pop the next batch: from the queue's head, drop dead work until ``window`` live items of the oldest
        live item's group are in view, then pick by length around the oldest. Only that head is walked: the
        queue may hold thousands of items (a cancelled request's stop counting at once, by ``_forget``).

        The walk goes a request at a time: a request's queued items lie next to each other (``submit`` appends
        them together, and taking items out of the queue keeps the order of the rest), and ``queued`` counts
        them, so whether a request is still wanted is asked once and its items are kept or dropped as one slice
        (at 32 texts a request, a 256-item window is 8 steps, not 256). Where the count does not fit the queue
        (it would reach past the end, or the item it ends at is another request's), the walk goes one item at a
        time."""
        now = time.monotonic()
        queue = self._queue
        end = len(queue)
        window = self.window
        kept: list[_Slot] = []  # the live items walked, in order
        group: Any = _NO_GROUP
        in_group = 0  # of them, the oldest live item's group's
        at = 0  # the walk's place in the queue
        while at < end:
            slot = queue[at]
            req = slot.request
            run = req.queued
            if run != 1 and (run < 1 or at + run > end or queue[at + run - 1].request is not req):
                run = 1
            if req.done():
                req.queued -= run
                at += run
                if req.cancelled:
                    self._dead -= run
                    for _ in range(run):
                        self._dropped("cancelled")
                continue
            if req.deadline is not None and now > req.deadline:
                req.queued -= run
                at += run
                self._dropped("deadline")
                req.future.set_exception(Timeout("the request's deadline passed while it was queued"))
                continue
            if group is _NO_GROUP:
                group = slot.group  # the oldest item's group: nobody starves, groups never mix
            if slot.group != group:
                kept.extend(queue[at:at + run])
                at += run
                continue
            if run == 1:  # one text a request: an append costs less than a slice
                kept.append(slot)
            else:
                run = min(run, window - in_group)
                kept.extend(queue[at:at + run])
            at += run
            in_group += run
            if in_group == window:
                break
        if not kept:
            self._queue = queue[at:]
            return []
        one_group = in_group == len(kept)  # every kept item is of that group
        candidates = kept if one_group else [s for s in kept if s.group == group]
        places = self._around_oldest([s.cost for s in candidates])
        chosen = [candidates[i] for i in places]
        for slot in chosen:
            slot.request.queued -= 1
        if one_group:
            left = bytearray(b"\x01") * len(kept)
            for i in places:
                left[i] = 0
            rest = list(compress(kept, left))
        else:
            picked = set(map(id, chosen))
            rest = [s for s in kept if id(s) not in picked]
        rest += queue[at:]
        self._queue = rest
        return chosen

    def _forget(self, req: _Request) -> None:
        """A request that will not be answered (its caller went away or its deadline passed): its queued items
        stop counting at once (``depth``, the 429 bound), and ``_take`` drops them when it walks past them."""
        self._dead += req.queued

    def _around_oldest(self, costs: list[int]) -> list[int]:
        """The places in ``costs`` (the window's items', oldest first) of the batch grown from the oldest item
        through its length-neighbours within the budget, always adding the neighbour that adds the least
        padding, and none that would more than double its own work in padding (plus ``PAD_SLACK`` tokens): a
        long item does not join a batch of short ones. In length order, shortest first (a stable sort).

        Longer neighbours as long as the longest item add no padding: they join as one step, as many as the
        budget and ``max_batch_size`` allow, where one at a time would choose the same ones (short texts often
        share a length, so a batch of 40 is a handful of steps)."""
        order = sorted(range(len(costs)), key=costs.__getitem__)
        ordered = sorted(costs)  # the costs in that order
        lo = hi = bisect_left(ordered, costs[0])  # the oldest item's place: the first of its length (stable)
        longest = ordered[lo]  # always ordered[hi]
        budget, most, last = self.max_batch_tokens, self.max_batch_size, len(ordered) - 1
        while hi - lo + 1 < most:
            size = hi - lo + 2
            down = up = None  # the padding that the shorter / the longer neighbour would add
            if lo > 0 and size * longest <= budget:
                cost = ordered[lo - 1]
                if longest - cost <= cost + PAD_SLACK:
                    down = longest - cost
            if hi < last:
                cand = ordered[hi + 1]
                added = (cand - longest) * (size - 1)
                if size * cand <= budget and added <= cand + PAD_SLACK:
                    up = added
            if down is not None and (up is None or down <= up):  # the least padding; the shorter on a tie
                lo -= 1  # (never as long as the longest: the batch starts at the first item of its length)
            elif up is not None:
                if up == 0:  # every item above as long as the longest, as far as the batch has room
                    room = min(most, budget // longest) if longest else most  # items of this length it may hold
                    hi = min(bisect_right(ordered, longest, hi) - 1, lo + room - 1)
                else:
                    hi += 1
                    longest = ordered[hi]
            else:
                break
        return order[lo : hi + 1]
