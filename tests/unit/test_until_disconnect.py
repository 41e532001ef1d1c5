"""``core.api.http.until_disconnect``: a client that leaves cancels the work (ClientClosed), a cancellation from
elsewhere stays a cancellation, work done before ``WATCH_AFTER_S`` costs no watcher, and nothing is left running
after."""

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
