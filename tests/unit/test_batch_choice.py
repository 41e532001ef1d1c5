"""The batcher's choice of a batch (``Batcher._take``) against a plain statement of its rule: of the queue's
live items, the oldest live item's group, the oldest ``window`` of them, sorted by length (stably), grown from
the oldest item by the neighbour that adds the least padding. Random queues with dead work (cancelled, past the
deadline) and several groups; the chosen items, the queue left behind and the dropped work must all be the
rule's."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from core.batching import PAD_SLACK, Batcher, _Request, _Slot
from core.errors import Timeout


def reference(queue: list[_Slot], now: float, *, window: int, size: int, budget: int):
    """(chosen, queue left, requests failed for their deadline): the rule written plainly."""
    live, expired, walked = [], [], 0
    group, in_group = None, 0
    for slot in queue:
        walked += 1
        req = slot.request
        if req.cancelled or req.future.done() or req in expired:
            continue
        if req.deadline is not None and now > req.deadline:
            expired.append(req)
            continue
        if not live:
            group = slot.group
        live.append(slot)
        if slot.group == group:
            in_group += 1
            if in_group == window:
                break
    candidates = [s for s in live if s.group == group]
    if not candidates:
        return [], queue[walked:], expired
    ordered = sorted(candidates, key=lambda s: s.cost)
    lo = hi = next(i for i, s in enumerate(ordered) if s is candidates[0])
    longest = ordered[lo].cost
    while hi - lo + 1 < size:
        n = hi - lo + 2
        options = []
        if lo > 0 and n * longest <= budget and longest - ordered[lo - 1].cost <= ordered[lo - 1].cost + PAD_SLACK:
            options.append((longest - ordered[lo - 1].cost, -1))
        if hi + 1 < len(ordered):
            cand = max(longest, ordered[hi + 1].cost)
            added = (cand - longest) * (n - 1)
            if n * cand <= budget and added <= cand + PAD_SLACK:
                options.append((added, 1))
        if not options:
            break
        if min(options)[1] < 0:
            lo -= 1
        else:
            hi += 1
            longest = max(longest, ordered[hi].cost)
    chosen = ordered[lo:hi + 1]
    left = [s for s in live if not any(s is c for c in chosen)] + queue[walked:]
    return chosen, left, expired


def random_queue(rng: random.Random, loop: asyncio.AbstractEventLoop, now: float) -> list[_Slot]:
    queue = []
    for _ in range(rng.randint(0, 40)):
        n = rng.choice([1, 1, 2, 5, 32])
        fate = rng.random()
        deadline = now - 1 if fate < 0.1 else (now + 60 if fate < 0.5 else None)
        req = _Request(loop.create_future(), [None] * n, n, deadline, now, queued=n)
        if 0.1 <= fate < 0.2:
            req.cancelled = True
        elif 0.2 <= fate < 0.25:
            req.future.set_result(None)  # answered already (an earlier failure)
        group = rng.choice([None, None, None, "image"])
        length = rng.choice([4, 13, 13, 40, 130, 300])
        for i in range(n):
            cost = max(1, length + rng.randint(-3, 3)) if rng.random() < 0.7 else rng.randint(1, 400)
            queue.append(_Slot(req, i, ("item", i), cost, group))
    return queue


@pytest.mark.parametrize("seed", range(40))
def test_take_chooses_as_the_rule_says(seed):
    rng = random.Random(seed)
    size, budget = rng.choice([(8, 64), (64, 512), (32, 16384), (4, 1000)])

    async def main():
        loop = asyncio.get_running_loop()
        batcher = Batcher(lambda items: items, max_batch_tokens=budget, max_batch_size=size, max_queue_items=10**6,
                          window=rng.choice([None, 3, 10]))
        now = time.monotonic()
        queue = random_queue(rng, loop, now)
        batcher._queue = list(queue)
        batcher._dead = sum(1 for s in queue if s.request.cancelled)
        for _ in range(6):  # several takes in a row over the same queue
            expected, left, expired = reference(batcher._queue, time.monotonic(), window=batcher.window, size=size,
                                                budget=budget)
            chosen = batcher._take()
            assert [id(s) for s in chosen] == [id(s) for s in expected]
            assert [id(s) for s in batcher._queue] == [id(s) for s in left]
            for req in expired:
                assert isinstance(req.future.exception(), Exception)
        assert batcher._dead >= 0

    asyncio.run(main())


def test_the_window_holds_four_batches_of_items_whatever_their_length():
    """A 512-token budget: after the oldest item (130 tokens) come 15 of 300 tokens (none fits beside it), then
    130-token items that would. The window is 4 × max_batch_size items, not tokens (measured: a window of four
    batches' worth of tokens gave the default model 12% more CPU per embedding on mixed lengths, from the
    padding of worse-matched batches), so they are in view and join the oldest; the rest stays queued in order."""
    async def main():
        loop = asyncio.get_running_loop()
        batcher = Batcher(lambda items: items, max_batch_tokens=512, max_batch_size=64, max_queue_items=10**6)
        costs = [130] + [300] * 15 + [130] * 10
        req = _Request(loop.create_future(), [None] * len(costs), len(costs), None, time.monotonic(),
                       queued=len(costs))
        batcher._queue = [_Slot(req, i, i, cost, None) for i, cost in enumerate(costs)]
        assert [s.item for s in batcher._take()] == [0, 16, 17]
        assert [s.item for s in batcher._queue] == [i for i in range(len(costs)) if i not in (0, 16, 17)]

    asyncio.run(main())


def queue_runs(queue: list[_Slot]) -> dict[_Request, list[int]]:
    """Each request's queued items' indices, asserting that they lie next to each other in the queue."""
    runs: dict[_Request, list[int]] = {}
    previous = None
    for slot in queue:
        if slot.request is not previous:
            assert slot.request not in runs, "a request's queued items are split by another's"
            runs[slot.request] = []
            previous = slot.request
        runs[slot.request].append(slot.index)
    return runs


@pytest.mark.parametrize("seed", range(8))
def test_a_requests_queued_items_stay_next_to_each_other(seed):
    """What ``_take``'s walk rests on (it keeps or drops a request's items as one slice): through submits,
    cancellations, deadlines and batches taken, each request's queued items lie next to each other, in order, and
    its ``queued`` counts them. Driven through ``submit`` and the batcher's own loop; every answer is checked."""
    rng = random.Random(seed)
    gate = threading.Event()

    def run_batch(items):
        gate.wait(5)
        return [("out", item) for item in items]

    async def main():
        batcher = Batcher(run_batch, max_batch_tokens=64, max_batch_size=8, max_queue_items=10**6)
        await batcher.start()
        submitted: list[tuple[asyncio.Task, list]] = []
        checks = 0
        for _ in range(25):
            for _ in range(rng.randint(1, 6)):
                n = rng.choice([1, 1, 2, 5, 32])
                items = [(len(submitted), i) for i in range(n)]
                deadline = time.monotonic() + (0.002 if rng.random() < 0.1 else 60)
                task = asyncio.create_task(batcher.submit(items, costs=[rng.randint(1, 20) for _ in range(n)],
                                                          deadline=deadline))
                submitted.append((task, items))
            await asyncio.sleep(0)  # they queue their items
            for task, _ in rng.sample(submitted, k=min(2, len(submitted))):
                task.cancel()
            await asyncio.sleep(0)
            for phase in range(2):
                runs = queue_runs(batcher._queue)
                for req, indices in runs.items():
                    assert indices == sorted(indices)
                    assert req.queued == len(indices)
                checks += len(runs)
                if phase == 0:  # let a few batches run, then hold the next one again
                    gate.set()
                    await asyncio.sleep(0.003)
                    gate.clear()
        gate.set()
        await asyncio.gather(*(task for task, _ in submitted), return_exceptions=True)
        answered = 0
        for task, items in submitted:
            if task.cancelled() or isinstance(task.exception(), Timeout):
                continue
            assert task.result() == [("out", item) for item in items]
            answered += 1
        await batcher.stop()
        return checks, answered

    checks, answered = asyncio.run(main())
    assert checks > 0 and answered > 0
