"""The batcher on its own, driven by a recording batch function (the thing under test is the batcher)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from core.batching import Batcher
from core.errors import BackendFailure, NotReady, Overloaded, Timeout


class Recorder:
    """Batch function that records each batch (as item values) and can be slowed or made to fail."""

    def __init__(self, delay: float = 0.0, fail_on=None):
        self.batches: list[list] = []
        self.delay = delay
        self.fail_on = fail_on or (lambda batch: False)
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items):
        self.gate.wait(5)
        self.batches.append(list(items))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on(items):
            raise RuntimeError("injected fault")
        return [("out", x) for x in items]


def make(fn, **kw) -> Batcher:
    opts = dict(max_batch_tokens=1000, max_batch_size=8, max_queue_items=100)
    opts.update(kw)
    return Batcher(fn, **opts)


def run(coro):
    return asyncio.run(coro)


def test_results_in_order_and_split_across_batches():
    rec = Recorder()

    async def main():
        b = make(rec, max_batch_size=4)
        await b.start()
        out = await b.submit(list(range(10)), costs=[5] * 10)
        await b.stop()
        return out

    out = run(main())
    assert out == [("out", i) for i in range(10)]
    assert all(len(batch) <= 4 for batch in rec.batches)
    assert sum(len(batch) for batch in rec.batches) == 10


def test_runs_at_once_when_idle():
    rec = Recorder()

    async def main():
        b = make(rec)
        await b.start()
        t = time.perf_counter()
        await b.submit(["x"], costs=[3])
        elapsed = time.perf_counter() - t
        await b.stop()
        return elapsed

    assert run(main()) < 0.05  # no fixed wait window


def test_coalesces_while_busy_and_respects_token_budget():
    rec = Recorder()

    async def main():
        b = make(rec, max_batch_tokens=40, max_batch_size=64)
        await b.start()
        rec.gate.clear()  # the first batch blocks in the backend; the rest queue up
        first = asyncio.ensure_future(b.submit(["first"], costs=[10]))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(b.submit([f"r{i}"], costs=[10])) for i in range(8)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        await asyncio.gather(first, *rest)
        await b.stop()

    run(main())
    assert rec.batches[0] == ["first"]
    # 8 items of 10 tokens, budget 40 padded tokens → two batches of 4
    assert [len(x) for x in rec.batches[1:]] == [4, 4]


def test_length_sorting_groups_similar_lengths():
    rec = Recorder()

    async def main():
        b = make(rec, max_batch_tokens=10_000, max_batch_size=4)
        await b.start()
        rec.gate.clear()
        blocker = asyncio.ensure_future(b.submit(["block"], costs=[1]))
        await asyncio.sleep(0.05)
        costs = [100, 5, 100, 5, 100, 5, 100, 5]
        subs = [asyncio.ensure_future(b.submit([f"{c}-{i}"], costs=[c])) for i, c in enumerate(costs)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        await asyncio.gather(blocker, *subs)
        await b.stop()

    run(main())
    for batch in rec.batches[1:]:
        lengths = {item.split("-")[0] for item in batch}
        assert len(lengths) == 1, f"mixed lengths in one batch: {batch}"
    # the oldest queued item (100-0) ran first
    assert rec.batches[1][0].startswith("100")


def test_oversized_single_item_still_runs():
    rec = Recorder()

    async def main():
        b = make(rec, max_batch_tokens=10)
        await b.start()
        out = await b.submit(["big"], costs=[500])
        await b.stop()
        return out

    assert run(main()) == [("out", "big")]


def test_queue_full_raises_overloaded():
    rec = Recorder()

    async def main():
        b = make(rec, max_queue_items=5, retry_after_s=3)
        await b.start()
        rec.gate.clear()
        blocker = asyncio.ensure_future(b.submit(["a"], costs=[1]))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(b.submit(list("bcde"), costs=[1] * 4))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as info:
            await b.submit(list("fg"), costs=[1, 1])
        rec.gate.set()
        await asyncio.gather(blocker, queued)
        await b.stop()
        return info.value

    err = run(main())
    assert err.status == 429 and err.headers() == {"Retry-After": "3"}


def test_failing_batch_fails_only_its_requests():
    rec = Recorder(fail_on=lambda batch: "bad" in batch)

    async def main():
        b = make(rec, max_batch_size=1)
        await b.start()
        results = await asyncio.gather(
            b.submit(["good1"], costs=[1]), b.submit(["bad"], costs=[1]), b.submit(["good2"], costs=[1]),
            return_exceptions=True,
        )
        await b.stop()
        return results

    good1, bad, good2 = run(main())
    assert good1 == [("out", "good1")] and good2 == [("out", "good2")]
    assert isinstance(bad, BackendFailure) and "injected fault" in bad.message


def test_deadline_passed_in_queue_is_dropped_before_inference():
    rec = Recorder()
    drops = []

    async def main():
        b = make(rec, on_drop=drops.append)
        await b.start()
        rec.gate.clear()
        blocker = asyncio.ensure_future(b.submit(["slow"], costs=[1]))
        await asyncio.sleep(0.02)
        with pytest.raises(Timeout):
            await b.submit(["late"], costs=[1], deadline=time.monotonic() + 0.05)
        rec.gate.set()
        await blocker
        await b.submit(["after"], costs=[1])
        await b.stop()

    run(main())
    ran = [x for batch in rec.batches for x in batch]
    assert "late" not in ran and "after" in ran
    assert drops == ["cancelled"]  # the waiter gave up first; its item was skipped at the next take


def test_cancelled_caller_work_is_dropped():
    rec = Recorder()
    drops = []

    async def main():
        b = make(rec, on_drop=drops.append)
        await b.start()
        rec.gate.clear()
        blocker = asyncio.ensure_future(b.submit(["slow"], costs=[1]))
        await asyncio.sleep(0.02)
        gone = asyncio.ensure_future(b.submit(["gone1", "gone2"], costs=[1, 1]))
        await asyncio.sleep(0.02)
        gone.cancel()  # what a client disconnect does to the handler's task
        rec.gate.set()
        await blocker
        await b.stop()

    run(main())
    ran = [x for batch in rec.batches for x in batch]
    assert "gone1" not in ran and "gone2" not in ran
    assert drops == ["cancelled", "cancelled"]


def test_a_cancelled_request_frees_its_queue_room_at_once():
    """While a batch runs, a cancelled request's queued items leave the queue when it is cancelled (not when a
    batch would have reached them): the queue's depth drops and a request that needs the room is queued."""
    rec = Recorder()

    async def main():
        b = make(rec, max_batch_size=2, max_queue_items=6, on_drop=lambda reason: None)
        await b.start()
        rec.gate.clear()
        blocker = asyncio.ensure_future(b.submit(["slow"], costs=[1]))
        await asyncio.sleep(0.02)
        gone = asyncio.ensure_future(b.submit([f"gone{i}" for i in range(5)], costs=[1] * 5))
        await asyncio.sleep(0.02)
        full = b.depth
        with pytest.raises(Overloaded):
            await b.submit(["late0", "late1", "late2"], costs=[1] * 3)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        emptied = b.depth
        later = asyncio.ensure_future(b.submit(["late0", "late1", "late2"], costs=[1] * 3))
        await asyncio.sleep(0)
        rec.gate.set()
        await blocker
        out = await later
        for _ in range(100):  # the cancelled items are walked past once the batcher takes its next batch
            if b.depth == 0:
                break
            await asyncio.sleep(0.01)
        drained = b.depth
        await b.stop()
        return full, emptied, out, drained

    full, emptied, out, drained = run(main())
    assert (full, emptied, drained) == (5, 0, 0)
    assert out == [("out", "late0"), ("out", "late1"), ("out", "late2")]
    assert not any(str(x).startswith("gone") for batch in rec.batches for x in batch)


def test_queue_depth_stays_exact_through_many_cancellations():
    """200 requests of 1–5 items, every third cancelled at some point while queued or running: every other
    request gets its answer, the queue's depth never goes below zero, and it ends at zero."""
    import random

    rec = Recorder(delay=0.001)
    rng = random.Random(7)
    depths = []

    async def main():
        b = make(rec, max_batch_size=4, max_queue_items=10_000, workers=2)
        await b.start()
        tasks = []
        for i in range(200):
            n = rng.randint(1, 5)
            tasks.append(asyncio.ensure_future(b.submit([(i, k) for k in range(n)], costs=[rng.randint(1, 9)] * n)))
            if rng.random() < 0.5:
                await asyncio.sleep(0)
            depths.append(b.depth)
        for i, task in enumerate(tasks):
            if i % 3 == 0:
                await asyncio.sleep(rng.random() * 0.002)
                task.cancel()
            depths.append(b.depth)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for _ in range(200):
            if b.depth == 0:
                break
            await asyncio.sleep(0.01)
        depths.append(b.depth)
        await b.stop()
        return results

    results = run(main())
    for i, result in enumerate(results):
        if not isinstance(result, BaseException):
            assert result == [("out", (i, k)) for k in range(len(result))]
        else:
            assert i % 3 == 0 and isinstance(result, asyncio.CancelledError)
    assert sum(not isinstance(r, BaseException) for r in results) >= 133
    assert min(depths) >= 0 and depths[-1] == 0


def test_not_accepting_before_start_and_after_stop():
    async def main():
        b = make(Recorder())
        with pytest.raises(NotReady):
            await b.submit(["x"], costs=[1])
        await b.start()
        assert await b.submit(["x"], costs=[1]) == [("out", "x")]
        await b.stop()
        with pytest.raises(NotReady):
            await b.submit(["x"], costs=[1])

    run(main())


def test_stop_drains_in_flight_work():
    rec = Recorder(delay=0.05)

    async def main():
        b = make(rec, max_batch_size=2)
        await b.start()
        subs = [asyncio.ensure_future(b.submit([i], costs=[1])) for i in range(6)]
        await asyncio.sleep(0.01)
        await b.stop(drain=True, timeout=5)
        return await asyncio.gather(*subs)

    assert run(main()) == [[("out", i)] for i in range(6)]


def test_wrong_result_count_is_a_backend_failure():
    async def main():
        b = make(lambda items: items[:-1])
        await b.start()
        with pytest.raises(BackendFailure, match="results for"):
            await b.submit([1, 2], costs=[1, 1])
        await b.stop()

    run(main())


def test_long_item_does_not_join_short_batch():
    """Padding 31 short items to one long item's length would cost far more than two batches."""
    rec = Recorder()

    async def main():
        b = make(rec, max_batch_tokens=100_000, max_batch_size=64)
        await b.start()
        rec.gate.clear()
        blocker = asyncio.ensure_future(b.submit(["block"], costs=[1]))
        await asyncio.sleep(0.05)
        subs = [asyncio.ensure_future(b.submit(["long"], costs=[256]))]
        subs += [asyncio.ensure_future(b.submit([f"short{i}"], costs=[13])) for i in range(31)]
        await asyncio.sleep(0.05)
        rec.gate.set()
        await asyncio.gather(blocker, *subs)
        await b.stop()

    run(main())
    assert rec.batches[1] == ["long"]
    assert sorted(rec.batches[2]) == sorted(f"short{i}" for i in range(31))


def test_two_workers_run_two_full_batches_at_once():
    """workers=2: two full batches are in the batch function at the same time (a barrier of two would
    time out if they ran one after the other)."""
    barrier = threading.Barrier(2, timeout=5)
    batches = []

    def fn(items):
        batches.append(list(items))
        barrier.wait()
        return [("out", x) for x in items]

    async def main():
        b = make(fn, max_batch_size=4, workers=2)
        await b.start()
        out = await asyncio.gather(b.submit(list(range(4)), costs=[5] * 4),
                                   b.submit(list(range(4, 8)), costs=[5] * 4))
        await b.stop()
        return out

    first, second = run(main())
    assert first == [("out", i) for i in range(4)] and second == [("out", i) for i in range(4, 8)]
    assert sorted(map(sorted, batches)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_two_workers_hold_a_partial_batch_back_while_one_runs():
    """A second worker does not start a half-empty batch while the first runs: queued work coalesces."""
    rec = Recorder()
    rec.gate.clear()

    async def main():
        b = make(rec, max_batch_size=4, workers=2)
        await b.start()
        full = asyncio.create_task(b.submit([0, 1, 2, 3], costs=[5] * 4))
        await asyncio.sleep(0.05)  # the full batch is now blocked in the batch function
        late = []
        for x in (4, 5):  # one by one: a free worker would take each alone
            late.append(asyncio.create_task(b.submit([x], costs=[5])))
            await asyncio.sleep(0.05)
        rec.gate.set()
        out = await asyncio.gather(full, *late)
        await b.stop()
        return out

    out = run(main())
    assert out == [[("out", i) for i in range(4)], [("out", 4)], [("out", 5)]]
    assert sorted(map(sorted, rec.batches)) == [[0, 1, 2, 3], [4, 5]]


def test_two_workers_stop_fails_running_and_queued_work():
    rec = Recorder()
    rec.gate.clear()

    async def main():
        b = make(rec, max_batch_size=2, workers=2)
        await b.start()
        tasks = [asyncio.create_task(b.submit([x], costs=[5])) for x in range(6)]
        await asyncio.sleep(0.05)
        await b.stop(drain=False)
        rec.gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    out = run(main())
    assert out and all(isinstance(r, NotReady) for r in out)


class ThreadRecorder(Recorder):
    """Also records the thread each batch ran on, and burns ``burn`` seconds of CPU per batch."""

    def __init__(self, burn: float = 0.0, **kw):
        super().__init__(**kw)
        self.threads: list[str] = []
        self.burn = burn

    def __call__(self, items):
        self.threads.append(threading.current_thread().name)
        until = time.thread_time() + self.burn
        while time.thread_time() < until:
            pass
        return super().__call__(items)


def test_a_batch_of_a_size_known_to_be_quick_runs_on_the_event_loop():
    """The first batch of a size class runs on the inference thread, which measures it; once batches of that size
    are known to take under ``inline_below_s`` of CPU, they run on the loop itself (no hand-over to a thread and
    back). Another size class starts on the thread again. Results and their order are the same either way."""
    rec = ThreadRecorder()

    async def main():
        b = make(rec, inline_below_s=0.01, name="quick")
        await b.start()
        outs = [await b.submit([i, i + 1], costs=[5, 5]) for i in range(3)]  # 10 padded tokens: one size class
        outs.append(await b.submit(list(range(8)), costs=[60] * 8))  # 480 padded tokens: another
        outs.append(await b.submit(list(range(8)), costs=[60] * 8))
        await b.stop()
        return outs

    outs = run(main())
    assert outs[:3] == [[("out", i), ("out", i + 1)] for i in range(3)]
    assert outs[3] == outs[4] == [("out", i) for i in range(8)]
    assert rec.threads[0].startswith("infer-quick") and rec.threads[3].startswith("infer-quick")
    assert rec.threads[1] == rec.threads[2] == rec.threads[4] == "MainThread"


def test_a_slow_batch_and_a_batcher_without_the_option_stay_on_the_thread():
    slow, plain = ThreadRecorder(burn=0.02), ThreadRecorder()

    async def main():
        b = make(slow, inline_below_s=0.005, name="slow")
        c = make(plain, name="plain")  # inline_below_s: 0 (the default)
        for batcher in (b, c):
            await batcher.start()
            for i in range(4):
                assert await batcher.submit([i], costs=[5]) == [("out", i)]
            await batcher.stop()

    run(main())
    assert len(slow.threads) == len(plain.threads) == 4
    assert all(t.startswith("infer-slow") for t in slow.threads)
    assert all(t.startswith("infer-plain") for t in plain.threads)


def test_a_failing_batch_on_the_loop_fails_only_its_requests():
    rec = ThreadRecorder(fail_on=lambda items: "bad" in items)

    async def main():
        b = make(rec, inline_below_s=0.01)
        await b.start()
        assert await b.submit(["ok"], costs=[5]) == [("out", "ok")]  # measured on the thread
        with pytest.raises(BackendFailure, match="injected fault"):
            await b.submit(["bad"], costs=[5])  # on the loop now
        assert await b.submit(["after"], costs=[5]) == [("out", "after")]
        await b.stop()

    run(main())
    assert rec.threads[1:] == ["MainThread", "MainThread"]


def test_a_batch_that_waits_on_the_loop_sends_its_size_back_to_the_thread():
    """A batch function that waits rather than computes (a device, a sleep) looks quick by its thread's CPU time.
    A batch of its size that then held the loop far too long sends that size back to the thread until its
    average is under the limit again; the third time, for good (one such run may be the machine's doing)."""
    sleeper = ThreadRecorder(delay=0.03)

    async def main():
        b = make(sleeper, inline_below_s=0.002, name="waits")
        await b.start()
        for i in range(60):
            assert await b.submit([i], costs=[5]) == [("out", i)]
        await b.stop()

    run(main())
    on_loop = [i for i, t in enumerate(sleeper.threads) if t == "MainThread"]
    assert len(on_loop) == 3 and on_loop[0] == 1, on_loop  # 30 ms > 10 × 2 ms, three times, then never again
    assert all(t.startswith("infer-waits") for i, t in enumerate(sleeper.threads) if i not in on_loop)
