"""``core.api.http.until_disconnect``: a client that leaves cancels the work (ClientClosed), a cancellation from
elsewhere stays a cancellation, work done before ``WATCH_AFTER_S`` costs no watcher, and nothing is left running
after. The work runs in the caller's own task (no task of its own), so the client's leaving cancels that task and
the cancellation is spent (``Task.cancelling`` back to where it was) however the work ends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from core.api.http import WATCH_AFTER_S, until_disconnect
from core.errors import ClientClosed


def channel():
    """A receive channel whose disconnect is sent by setting the returned event."""
    leave = asyncio.Event()

    async def receive():
        await leave.wait()
        return {"type": "http.disconnect"}

    return SimpleNamespace(receive=receive), leave


def test_the_answer_when_the_client_stays():
    async def main():
        request, _ = channel()
        before = len(asyncio.all_tasks())

        async def work():
            await asyncio.sleep(0)
            return 42

        assert await until_disconnect(request, work()) == 42
        await asyncio.sleep(0)  # the watcher's cancellation is processed
        assert len(asyncio.all_tasks()) == before
        assert asyncio.current_task().cancelling() == 0

    asyncio.run(main())


def test_work_done_sooner_than_the_watch_delay_reads_nothing_from_the_client():
    async def main():
        reads = []

        async def receive():
            reads.append(1)
            await asyncio.Event().wait()

        async def work():
            await asyncio.sleep(0)
            return "quick"

        assert await until_disconnect(SimpleNamespace(receive=receive), work()) == "quick"
        await asyncio.sleep(WATCH_AFTER_S * 2)  # past the delay: no watcher starts after the answer either
        assert reads == []

        async def slow():
            await asyncio.sleep(WATCH_AFTER_S * 3)
            return "slow"

        assert await until_disconnect(SimpleNamespace(receive=receive), slow()) == "slow"
        assert reads == [1]  # a watcher read the channel while the slow work ran

    asyncio.run(main())


def test_a_client_that_leaves_cancels_the_work():
    async def main():
        request, leave = channel()
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def work():
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        async def route():
            with pytest.raises(ClientClosed):
                await until_disconnect(request, work())
            assert asyncio.current_task().cancelling() == 0  # the request's task goes on to answer
            await asyncio.sleep(0)
            return "answered"

        task = asyncio.ensure_future(route())
        await started.wait()
        leave.set()
        assert await asyncio.wait_for(task, 30) == "answered"
        assert cancelled.is_set()

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_stays_one():
    async def main():
        request, _ = channel()
        started = asyncio.Event()

        async def work():
            started.set()
            await asyncio.Event().wait()

        task = asyncio.ensure_future(until_disconnect(request, work()))
        await started.wait()
        task.cancel()  # e.g. the shutdown giving up on the request
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_the_work_runs_in_the_callers_task():
    async def main():
        request, _ = channel()

        async def work():
            return asyncio.current_task()

        before = len(asyncio.all_tasks())
        assert await until_disconnect(request, work()) is asyncio.current_task()
        assert len(asyncio.all_tasks()) == before

    asyncio.run(main())


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_work_that_does_not_stop_on_the_clients_leaving_spends_the_cancellation(ending):
    """Work that catches the cancellation and returns (or raises an error of its own): its answer (or error)
    stands, and the caller's task is not left cancelling (a later ``asyncio.timeout`` would misread it)."""
    async def main():
        request, leave = channel()
        started = asyncio.Event()

        async def work():
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if ending == "returns":
                    return "finished anyway"
                raise LookupError("the work's own error") from None

        async def route():
            if ending == "returns":
                assert await until_disconnect(request, work()) == "finished anyway"
            else:
                with pytest.raises(LookupError):
                    await until_disconnect(request, work())
            assert asyncio.current_task().cancelling() == 0
            async with asyncio.timeout(5):
                await asyncio.sleep(0)  # the task goes on as any other
            return "answered"

        task = asyncio.ensure_future(route())
        await started.wait()
        leave.set()
        assert await asyncio.wait_for(task, 30) == "answered"

    asyncio.run(main())


def test_a_cancellation_from_elsewhere_while_the_client_leaves_stays_one():
    async def main():
        request, leave = channel()
        started = asyncio.Event()

        async def work():
            started.set()
            await asyncio.Event().wait()

        task = asyncio.ensure_future(until_disconnect(request, work()))
        await started.wait()
        await asyncio.sleep(WATCH_AFTER_S * 2)  # the watcher reads the channel
        leave.set()
        for _ in range(1000):  # until the client's leaving has cancelled the task
            if task.cancelling():
                break
            await asyncio.sleep(0)
        assert task.cancelling() == 1 and not task.done()
        task.cancel()  # and then the shutdown's: not swallowed as the client's
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
