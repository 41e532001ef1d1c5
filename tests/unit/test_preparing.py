"""``core.preparing.Preparers``: requests prepared on threads, each caller gets its own result or exception, a
group of requests queued behind a busy worker is handed back in one wake-up of the event loop, and a request
whose caller went away before a worker reached it is never prepared."""

from __future__ import annotations

import asyncio
import threading

import pytest

from core.preparing import Preparers, _deliver


class Gated:
    """Doubles its input; waits for ``gate`` on the value 0; raises on negatives; records what it prepared."""

    def __init__(self):
        self.gate = threading.Event()
        self.started = threading.Event()
        self.seen: list[int] = []

    def __call__(self, value: int) -> int:
        if value == 0:
            self.started.set()
            assert self.gate.wait(10)
        self.seen.append(value)
        if value < 0:
            raise ValueError(f"bad {value}")
        return value * 2


def test_each_caller_gets_its_own_result_or_exception():
    fn = Gated()
    fn.gate.set()

    async def main():
        prep = Preparers(fn, workers=2, name="t")
        results = await asyncio.gather(*(prep(v) for v in [3, -1, 5, 0, -7, 9]), return_exceptions=True)
        prep.shutdown()
        return results

    results = asyncio.run(main())
    assert results[0] == 6 and results[2] == 10 and results[3] == 0 and results[5] == 18
    assert isinstance(results[1], ValueError) and str(results[1]) == "bad -1"
    assert isinstance(results[4], ValueError) and str(results[4]) == "bad -7"


def test_requests_queued_behind_a_busy_worker_come_back_in_one_wake_up():
    fn = Gated()

    async def main():
        loop = asyncio.get_running_loop()
        wakes = []
        threadsafe = loop.call_soon_threadsafe

        def counted(callback, *args, **kwargs):
            if callback is _deliver:  # the preparers' hand-backs (the default executor's are not counted)
                wakes.append(len(args[0]))
            return threadsafe(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted
        prep = Preparers(fn, workers=1, name="t")
        first = asyncio.ensure_future(prep(0))
        await asyncio.to_thread(fn.started.wait, 10)  # the worker holds the first request
        rest = [asyncio.ensure_future(prep(v)) for v in range(1, 11)]
        await asyncio.sleep(0)
        fn.gate.set()
        results = await asyncio.gather(first, *rest)
        prep.shutdown()
        return results, wakes

    results, wakes = asyncio.run(main())
    assert results == [2 * v for v in range(11)]
    assert wakes == [1, 10]  # the first alone, the ten queued behind it together


def test_a_request_cancelled_before_a_worker_reaches_it_is_not_prepared():
    fn = Gated()

    async def main():
        prep = Preparers(fn, workers=1, name="t")
        first = asyncio.ensure_future(prep(0))
        await asyncio.to_thread(fn.started.wait, 10)
        gone = asyncio.ensure_future(prep(4))
        kept = asyncio.ensure_future(prep(5))
        await asyncio.sleep(0)
        gone.cancel()
        fn.gate.set()
        assert await first == 0 and await kept == 10
        with pytest.raises(asyncio.CancelledError):
            await gone
        prep.shutdown()

    asyncio.run(main())
    assert fn.seen == [0, 5]


def test_a_second_worker_serves_while_the_first_is_busy():
    fn = Gated()

    async def main():
        prep = Preparers(fn, workers=2, name="pair")
        first = asyncio.ensure_future(prep(0))
        await asyncio.to_thread(fn.started.wait, 10)  # one worker holds the first request
        second = await asyncio.wait_for(prep(7), 10)  # the other answers meanwhile
        assert not first.done()
        fn.gate.set()
        assert await first == 0
        prep.shutdown()
        return second

    assert asyncio.run(main()) == 14
    assert fn.seen == [7, 0]


def test_after_shutdown_new_requests_are_refused():
    async def main():
        prep = Preparers(lambda v: v, workers=1, name="t")
        assert await prep(1) == 1
        prep.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            await prep(2)

    asyncio.run(main())


def test_a_stop_iteration_reaches_its_caller_as_an_error_and_the_others_get_theirs():
    def fn(value: int) -> int:
        if value == 1:
            raise StopIteration
        return value

    async def main():
        prep = Preparers(fn, workers=1, name="t")
        results = await asyncio.gather(*(prep(v) for v in range(4)), return_exceptions=True)
        prep.shutdown()
        return results

    results = asyncio.run(main())
    assert results[0] == 0 and results[2:] == [2, 3]
    assert isinstance(results[1], RuntimeError) and "StopIteration" in str(results[1])
